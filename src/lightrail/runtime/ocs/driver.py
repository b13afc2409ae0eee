"""The interface every optical circuit switch (OCS) driver implements, and the checks they share.

An OCS has ``ports`` input ports and ``ports`` output ports, numbered ``0 .. ports-1``. A *configuration*
maps inputs to outputs (``{input: output}``) with no two inputs on one output: a partial permutation.
A *duplex* switch only lights bidirectional circuits, so its configuration is symmetric (``i -> j`` lit
iff ``j -> i`` lit). ``i -> i`` is a loopback, refused unless the driver allows it.

Changes are given as ``{input: new output}``, or ``{input: None}`` to darken that input; inputs not named
keep their circuit. Reconfiguring is partial: circuits that do not change keep carrying light, only the
ports whose circuit changes go dark for the reconfiguration delay.

Drivers take the current time as an argument (``now``, monotonic seconds) and never sleep: ``apply``
returns the time the new circuits are lit and the caller (the controller) awaits it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from lightrail.errors import InfeasibleError, ScenarioError

__all__ = ["OCSDriver", "changed_ports", "moving_ports", "validate_changes"]

Changes = Mapping[int, int | None]
"""A change set: input -> new output, or None to darken that input."""


@runtime_checkable
class OCSDriver(Protocol):
    """One optical circuit switch, as the controller drives it.

    Attributes
    ----------
    name : the device name (used in error messages and by the controller).
    ports : number of input ports (= number of output ports); ports are ``0 .. ports-1``.
    duplex : True if the switch only lights bidirectional circuits (symmetric configurations).
    delay_s : nominal reconfiguration delay in seconds (MEMS switches: about 10-25 ms).
    """

    name: str
    ports: int
    duplex: bool
    delay_s: float

    def state(self) -> dict[int, int]:
        """The lit circuits, ``{input: output}`` (a copy the caller may modify)."""
        ...

    def lit(self) -> Mapping[int, int]:
        """The lit circuits as :meth:`state` has them, without the copy: read-only, valid until the next change
        (the controller reads it once per granted round)."""
        ...

    def validate(self, changes: Changes) -> dict[int, int]:
        """Check ``changes`` against the current state without applying them; return the resulting configuration.

        Raises a :class:`~lightrail.errors.LightrailError` naming the port at fault (``field="configuration.<input>"``)
        for an unknown port, two inputs on one output, a duplex violation or a refused loopback.
        """
        ...

    def apply(self, changes: Changes, now: float) -> float:
        """Validate and commit ``changes``; return the completion time.

        The completion time is ``now + delay_s`` if any circuit changes, else ``now``. On error the state is
        left unchanged.
        """
        ...

    def changed_ports(self, changes: Changes) -> set[int]:
        """Port numbers (inputs and outputs) whose circuit ``changes`` would change: the ports that go dark.

        Validates ``changes`` like :meth:`validate`.
        """
        ...

    def restore(self, state: Mapping[int, int]) -> None:
        """Replace the whole configuration by ``state`` with no delay (controller restart); validates it first."""
        ...


def changed_ports(before: Mapping[int, int], after: Mapping[int, int]) -> tuple[set[int], set[int]]:
    """Inputs and outputs whose circuit differs between two configurations.

    An input changes if it goes to a different output (or goes dark, or lights up); an output changes if a
    different input (or none) feeds it. Those are the ports that carry no light during the reconfiguration.
    """
    inputs = {i for i in before.keys() | after.keys() if before.get(i) != after.get(i)}
    fed_before = {o: i for i, o in before.items()}
    fed_after = {o: i for i, o in after.items()}
    outputs = {o for o in fed_before.keys() | fed_after.keys() if fed_before.get(o) != fed_after.get(o)}
    return inputs, outputs


def moving_ports(before: Mapping[int, int], after: Mapping[int, int]) -> tuple[set[int], set[int]]:
    """Inputs and outputs a change steers: an input given a new output, an output fed by a new input.

    A port the change only darkens (its peer taken by another port, or disconnected) is left where it points: on a
    beam-steering OCS (3D MEMS, piezo collimators) each port's element turns only to make its own new connection,
    so another change may steer a darkened port at once. ``changed_ports`` minus these is what goes dark unmoved.
    """
    inputs = {i for i, o in after.items() if o is not None and before.get(i) != o}
    fed_before = {o: i for i, o in before.items()}
    outputs = {o for i, o in after.items() if o is not None and fed_before.get(o) != i}
    return inputs, outputs


def _check_port(port: object, ports: int, *, field: str, role: str, device: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int):
        raise ScenarioError(
            f"{role} {port!r} is a {type(port).__name__}, not a port number",
            field=field,
            fix=f"ports of {device!r} are integers 0..{ports - 1}",
        )
    if not 0 <= port < ports:
        raise ScenarioError(
            f"{role} {port} does not exist on {device!r}, which has {ports} ports",
            field=field,
            fix=f"use a port in 0..{ports - 1}",
        )


def validate_changes(
    state: Mapping[int, int],
    changes: Changes,
    *,
    ports: int,
    duplex: bool = False,
    allow_loopback: bool = False,
    device: str = "ocs",
) -> dict[int, int]:
    """Apply ``changes`` to a copy of ``state`` and check the result; return it (``state`` is not modified).

    Checks, in order: every input and output is an int in ``0..ports-1``; no loopback ``i -> i`` unless
    ``allow_loopback``; no two inputs on one output; if ``duplex``, every lit ``i -> j`` has ``j -> i``.
    Malformed ports raise :class:`ScenarioError`, unrealisable configurations :class:`InfeasibleError`,
    both with ``field="configuration.<input>"``.
    """
    if not isinstance(changes, Mapping):
        raise ScenarioError(
            f"changes must be a mapping input -> output, got {type(changes).__name__}",
            field="configuration",
            fix="pass a dict such as {0: 1, 1: 0, 2: None} (None darkens input 2)",
        )
    for i, o in changes.items():
        field = f"configuration.{i!r}"
        _check_port(i, ports, field=field, role="input port", device=device)
        if o is not None:
            _check_port(o, ports, field=field, role=f"input {i} -> output", device=device)
        if o == i and not allow_loopback:
            raise InfeasibleError(
                f"input {i} -> output {i} is a loopback, which {device!r} does not allow",
                field=field,
                fix=f"connect input {i} to another port, or darken it with {{{i}: None}}",
            )

    after = dict(state)
    for i, o in changes.items():
        if o is None:
            after.pop(i, None)
        else:
            after[i] = o

    fed_by: dict[int, int] = {}
    for i in sorted(after):
        o = after[i]
        if o in fed_by:
            first = fed_by[o]
            # Name a newcomer as the entry at fault; the other input is the one to darken or move.
            culprit, other = (i, first) if i in changes else (first, i)
            used = set(after.values())
            free = [p for p in range(ports) if p not in used][:5]
            hint = f" (free outputs: {', '.join(map(str, free))})" if free else ""
            if other in changes:
                fix = f"send input {first} or input {i} to another output{hint}"
            else:
                fix = (f"move or darken input {other} in the same change set ({{{other}: None}}), "
                       f"or send input {culprit} to another output{hint}")
            raise InfeasibleError(
                f"inputs {first} and {i} would both feed output {o}; an output takes one input",
                field=f"configuration.{culprit}",
                fix=fix,
            )
        fed_by[o] = i

    if duplex:
        for i in sorted(after):
            j = after[i]
            back = after.get(j)
            if back != i:
                now = "is dark" if back is None else f"goes to output {back}"
                if i in changes:  # a new circuit without its return
                    culprit, fix = i, f"add the return circuit {{{j}: {i}}} to the same change set"
                else:  # the return of an existing circuit was changed
                    culprit = j
                    fix = f"darken input {i} in the same change set ({{{i}: None}}), or leave input {j} as is"
                raise InfeasibleError(
                    f"{device!r} is duplex: circuit {i} -> {j} needs the return circuit {j} -> {i}, "
                    f"but input {j} {now}",
                    field=f"configuration.{culprit}",
                    fix=f"{fix} (a duplex switch only lights bidirectional circuits)",
                )
    return after
