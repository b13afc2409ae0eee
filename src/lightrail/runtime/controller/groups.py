"""The controller's group state and what it hands out: the errors a waiting rank gets (``Failover``,
``RankFailed``, ``Superseded``), the ``Waiter`` an acquire returns, grant ``Timings``, and ``GroupState`` (one group's
members, circuits, lease and grant timing). Semantics: see ``core.py``'s docstring.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from lightrail.errors import InfeasibleError, ScenarioError

_NEVER = float("-inf")  # a time before any: no switch, no revoke yet


_EPS = 1e-9  # seconds: a deadline this close counts as reached (float rounding of now + delay)


class Failover(InfeasibleError):
    """Wakes a rank waiting in its job's group when a rank failed over to a spare: re-declare, re-acquire."""


class RankFailed(InfeasibleError):
    """Wakes a rank waiting in its job's group when a rank failed and no spare is left."""


class Superseded(ScenarioError):
    """The answer to an acquire replaced by a later acquire of the same rank for the same group."""


class Waiter(asyncio.Future):
    """A blocked acquire's future whose ``on_done`` (the server's reply writer) runs the moment it is granted.
    A done callback would run one loop iteration later, after every read the loop already polled: at 1,024
    ranks the grant of a pair's first member then waited behind about a thousand other requests (issue 17).
    A failure or a cancel still reaches ``on_done`` as a done callback: a hold's reply goes out before the
    error of the acquire it superseded, as the client expects."""

    on_done: Callable[[asyncio.Future], None] | None = None

    def set_result(self, result) -> None:
        super().set_result(result)
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done(self)

    def set_exception(self, exception) -> None:
        self._as_callback()
        super().set_exception(exception)

    def cancel(self, msg=None) -> bool:
        self._as_callback()
        return super().cancel(msg)

    def _as_callback(self) -> None:
        if self.on_done is not None and not self.done():
            self.add_done_callback(self.on_done)
            self.on_done = None


class Timings:
    """Durations in seconds: the last 100,000 (``samples``, for quantiles) and the count and sum of all since
    start (a Prometheus summary's ``_count`` and ``_sum``, monotonic past the window). ``add`` is an append and
    two additions: it runs once per grant or revoke, on the request path."""

    __slots__ = ("samples", "count", "sum")

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=100_000)
        self.count = 0
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.count += 1
        self.sum += seconds

    def summary(self) -> dict:
        """Count, mean, median and p90 of the window (for JSON views and tests; sorts: not for the request path)."""
        xs = sorted(self.samples)
        if not xs:
            return {"count": self.count, "mean": None, "p50": None, "p90": None}
        return {"count": self.count, "mean": sum(xs) / len(xs), "p50": xs[len(xs) // 2],
                "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))]}


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class GroupStatus(StrEnum):
    """Where a group is in its round; the strings are what ``GET /jobs`` shows (docs/controller.md)."""

    IDLE = "idle"
    """Not granted: members may be asking, or its circuits lit for members that prepared."""
    APPLYING = "applying"
    """Its reconfiguration is under way: its ports are dark until the switch settles."""
    GRANTED = "granted"
    """Its members hold it (per op, or a lease): its ports carry traffic."""


@dataclass(eq=False)
class GroupState:
    job: str
    key: str
    phase: str
    members: frozenset[int]
    circuits: dict[str, dict[int, int]]
    intents: set[int] = field(default_factory=set)  # members that asked (acquire or prepare)
    acquirers: set[int] = field(default_factory=set)  # members that acquired (not just prepared)
    holders: set[int] = field(default_factory=set)  # members it is granted to (their traffic may flow)
    waiters: dict[int, tuple[asyncio.Future, float]] = field(default_factory=dict)  # blocked acquires
    status: GroupStatus = GroupStatus.IDLE  # idle -> (applying ->) granted -> idle once nobody holds it
    ready_since: float = 0.0
    lease_asks: set[int] = field(default_factory=set)  # acquirers that asked for a lease
    lease: int | None = None  # id of the lease this round is (None: a per-op round)
    revoking: bool = False  # revoke pushed to the holders
    ops: dict[int, int] = field(default_factory=dict)  # ops each member that acked or yielded ran under the lease
    limit: dict[int, int] = field(default_factory=dict)  # revoking: ops a holder still inside may reach
    # A round restored by ``hold`` after a restart: the members in it (held, or joined by a ``rejoin`` acquire
    # whose grant of that round was lost in the kill); None for a round of this controller.
    restored: set[int] | None = None
    # The op numbers (``op_no``) its holds were inside: a rejoining acquire joins only for one of them (an acquire
    # already for a later op would run it one op early and deadlock its peers). Several when holds disagree (a
    # lease's members may be an op apart); None while a hold without one (an older client) is in it: any joins.
    restored_ops: set[int] | None = None
    # Waiting acquires that carry ``rejoin``: rank -> the acquire's ``op_no`` (None: it carries none)
    rejoins: dict[int, int | None] = field(default_factory=dict)
    # Holders of a lease round that hold it by ``hold``: their connection was replaced while this controller ran
    # (their client turned the lease they were inside an op of into a per-op hold, released when the op ends):
    # rank -> the op's ``op_no``. Once no other holder is left the round goes on as one restored by hold (issue 31).
    held: dict[int, int | None] = field(default_factory=dict)
    # Lease accounting by op number, for a holder whose connection was lost (its client forgot the lease) and
    # that asks again while the others still hold it: each lease acquire's ``op_no`` (rank -> op_no), each
    # holder's ops on the key before the lease (rank -> op_no - 1), and the holders lost so (see
    # Switching._back_in_lease).
    lease_op: dict[int, int | None] = field(default_factory=dict)
    base: dict[int, int] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    round_ops: set[int] | None = None  # the op numbers of the acquires this controller's current round granted
    order: int = 0  # declaration order: ties in ready_since are scheduled in it (deterministic runs)
    # Grant timing (clock times; _NEVER: none): its latest switch's start and completion, the latest time a lease
    # kept it waiting, and when revoke was pushed to the holders of its own lease.
    switch_start: float = _NEVER
    switch_done: float = _NEVER
    revoked_at: float = _NEVER
    revoke_pushed: float = _NEVER

    def __post_init__(self) -> None:
        self._ports = {d: (set(c), set(c.values())) for d, c in self.circuits.items()}
        self._keys = frozenset((d, p) for d, (ins, outs) in self._ports.items() for p in ins | outs)

    def ports(self) -> dict[str, tuple[set[int], set[int]]]:
        """Per device, the inputs and the outputs its circuits use."""
        return self._ports

    def port_keys(self) -> frozenset[tuple[str, int]]:
        """Every (device, port) its circuits use, as input or output (what the port index holds)."""
        return self._keys

    def active(self) -> bool:
        """Its ports carry traffic: a change under way, holders, or a lease not yet over."""
        return self.status == GroupStatus.APPLYING or (
            self.status == GroupStatus.GRANTED and (bool(self.holders) or self.lease is not None))

    def ready(self) -> bool:
        """Every member asked and nothing is under way: the scheduler may light or grant it."""
        return self.status == GroupStatus.IDLE and bool(self.intents) and len(self.intents) == len(self.members)

    def unused(self) -> bool:
        """Nobody asks for, waits on or holds it: a changed declaration may replace it."""
        return (self.status == GroupStatus.IDLE and not self.intents and not self.holders and not self.waiters
                and self.lease is None)

    def started(self) -> int:
        """Revoking: the most ops any member ran or is allowed to run under the lease."""
        return max([*self.ops.values(), *self.limit.values(), 0])
