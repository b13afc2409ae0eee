"""An emulated optical circuit switch: the simulator's circuit-state model
(:class:`~lightrail.fabric.circuits.CircuitState`) behind the driver interface, a fixed delay, no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fabric.circuits import CircuitState
from lightrail.fabric.params import RECONFIG_DELAY
from lightrail.runtime.ocs.driver import Changes, changed_ports, validate_changes

__all__ = ["EmulatedOCS"]


class EmulatedOCS:
    """A switch that exists only in memory; implements :class:`~lightrail.runtime.ocs.driver.OCSDriver`.

    Parameters
    ----------
    name : device name, quoted in error messages.
    ports : number of input ports (= output ports), at least 1.
    delay_s : reconfiguration delay in seconds (finite, >= 0); the default is ``fabric.params.RECONFIG_DELAY``
        (10 ms, a fast MEMS switch).
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
        delay_s: float = RECONFIG_DELAY,
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
        self.circuits = CircuitState(1, ports, self.delay_s)  # the same model the simulator's rails use
        self._state: Mapping[int, int] | None = None  # state() cached between changes (the controller asks often)

    def __repr__(self) -> str:
        return (f"EmulatedOCS(name={self.name!r}, ports={self.ports}, delay_s={self.delay_s}, "
                f"duplex={self.duplex}, lit={len(self.state())})")

    def state(self) -> dict[int, int]:
        return dict(self.lit())

    def lit(self) -> Mapping[int, int]:
        if self._state is None:
            perm = self.circuits.tx_target[0]
            lit = np.flatnonzero(perm >= 0)
            self._state = MappingProxyType(dict(zip(lit.tolist(), perm[lit].tolist(), strict=True)))
        return self._state

    def lit_at(self) -> float:
        """When the last change's circuits are lit (the largest dark-until over the ports)."""
        return float(max(self.circuits.tx_dark.max(), self.circuits.rx_dark.max()))

    def _perm(self, config: Mapping[int, int]) -> np.ndarray:
        perm = np.full(self.ports, -1, np.int64)
        perm[list(config)] = list(config.values())
        return perm

    def validate(self, changes: Changes) -> dict[int, int]:
        return validate_changes(self.state(), changes, ports=self.ports, duplex=self.duplex,
                                allow_loopback=self.allow_loopback, device=self.name)

    def changed_ports(self, changes: Changes) -> set[int]:
        inputs, outputs = changed_ports(self.state(), self.validate(changes))
        return inputs | outputs

    def apply(self, changes: Changes, now: float) -> float:
        if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
            raise ScenarioError(f"now must be a finite time in seconds, got {now!r}", field="now",
                                fix="pass time.monotonic()")
        after = self.validate(changes)
        lit, inputs, outputs = self.circuits.configure(0, self._perm(after), float(now))
        self._state = None
        if not len(inputs):
            return now
        self.reconfigurations += 1
        self.circuit_changes += len(inputs)
        self.last_changed = set(inputs.tolist()) | set(outputs.tolist())
        return lit

    def restore(self, state: Mapping[int, int]) -> None:
        config = validate_changes({}, state, ports=self.ports, duplex=self.duplex,
                                  allow_loopback=self.allow_loopback, device=self.name)
        self.circuits = CircuitState(1, self.ports, self.delay_s)
        self._state = None
        self.circuits.tx_target[0] = self._perm(config)
        lit = np.flatnonzero(self.circuits.tx_target[0] >= 0)
        self.circuits.rx_source[0, self.circuits.tx_target[0, lit]] = lit
