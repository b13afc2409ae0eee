"""An emulated optical circuit switch: the configuration in a dict, a fixed reconfiguration delay, no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping

from lightrail.errors import ScenarioError
from lightrail.runtime.ocs.driver import Changes, changed_ports, validate_changes

__all__ = ["EmulatedOCS"]


class EmulatedOCS:
    """A switch that exists only in memory; implements :class:`~lightrail.runtime.ocs.driver.OCSDriver`.

    Parameters
    ----------
    name : device name, quoted in error messages.
    ports : number of input ports (= output ports), at least 1.
    delay_s : reconfiguration delay in seconds (finite, >= 0); the default 10 ms is a fast MEMS switch.
    duplex : only light bidirectional circuits (symmetric configurations), like a Polatis in duplex mode.
    allow_loopback : allow ``i -> i`` circuits.

    Counters: ``reconfigurations`` (applies that changed at least one circuit), ``circuit_changes`` (total
    number of inputs whose circuit changed). ``last_changed`` holds the ports (inputs and outputs) the last
    such apply darkened.
    """

    def __init__(
        self,
        name: str = "ocs",
        ports: int = 64,
        delay_s: float = 0.010,
        duplex: bool = False,
        allow_loopback: bool = False,
    ):
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"name must be a non-empty string, got {name!r}", field="name", fix='e.g. name="ocs0"')
        if isinstance(ports, bool) or not isinstance(ports, int) or ports < 1:
            raise ScenarioError(f"ports must be an integer >= 1, got {ports!r}", field="ports", fix="e.g. ports=64")
        if (
            isinstance(delay_s, bool)
            or not isinstance(delay_s, int | float)
            or not math.isfinite(delay_s)
            or delay_s < 0
        ):
            raise ScenarioError(
                f"delay_s must be a finite number of seconds >= 0, got {delay_s!r}",
                field="delay_s",
                fix="e.g. delay_s=0.010 for 10 ms (MEMS switches take about 10-25 ms)",
            )
        for option, value in (("duplex", duplex), ("allow_loopback", allow_loopback)):
            if not isinstance(value, bool):
                raise ScenarioError(f"{option} must be true or false, got {value!r}", field=option,
                                    fix=f"{option}=True or {option}=False")
        self.name = name
        self.ports = ports
        self.delay_s = float(delay_s)
        self.duplex = duplex
        self.allow_loopback = allow_loopback
        self.reconfigurations = 0
        self.circuit_changes = 0
        self.last_changed: set[int] = set()
        self._circuits: dict[int, int] = {}

    def __repr__(self) -> str:
        return (f"EmulatedOCS(name={self.name!r}, ports={self.ports}, delay_s={self.delay_s}, "
                f"duplex={self.duplex}, lit={len(self._circuits)})")

    def state(self) -> dict[int, int]:
        return dict(self._circuits)

    def validate(self, changes: Changes) -> dict[int, int]:
        return validate_changes(self._circuits, changes, ports=self.ports, duplex=self.duplex,
                                allow_loopback=self.allow_loopback, device=self.name)

    def changed_ports(self, changes: Changes) -> set[int]:
        inputs, outputs = changed_ports(self._circuits, self.validate(changes))
        return inputs | outputs

    def apply(self, changes: Changes, now: float) -> float:
        if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
            raise ScenarioError(f"now must be a finite time in seconds, got {now!r}", field="now",
                                fix="pass time.monotonic()")
        after = self.validate(changes)
        inputs, outputs = changed_ports(self._circuits, after)
        if not inputs:
            return now
        self._circuits = after
        self.reconfigurations += 1
        self.circuit_changes += len(inputs)
        self.last_changed = inputs | outputs
        return now + self.delay_s

    def restore(self, state: Mapping[int, int]) -> None:
        self._circuits = validate_changes({}, state, ports=self.ports, duplex=self.duplex,
                                          allow_loopback=self.allow_loopback, device=self.name)
