"""The controller's state machine: jobs own ports, communicators (groups) ask for circuits, and a
group's circuits are lit only when every member is ready and no port that changes carries traffic.

A *group* is one communicator of one job (a DP ring, a PP pair, ...) with the circuits it needs
on each device. Its members ``acquire`` it before an operation and ``release`` it after;
``prepare`` announces a coming acquire without blocking (provisioned mode), so the circuits can be
lit while the rank still computes. A rank has at most one outstanding group; asking for another
leaves the previous one.

Rules:
- lit: once every member asked (acquire or prepare), a group's circuits are lit if the ports its
  change switches carry no traffic, else it waits for their release;
- granted: once every member acquired and its circuits are lit, the members proceed; the circuits
  are reserved (carry traffic) until the last holder releases. Ranks hold circuits only inside an
  op, never while computing or waiting for a peer elsewhere, so waiting never forms a cycle beyond
  the program's own;
- no reconfiguration under traffic: a change must not switch an input or an output of a granted
  group with holders or of a change under way; ``unsafe_reconfigurations`` counts violations
  (always 0; the tests check it; ``GET /reconfigurations`` shows each change with the busy ports);
- skip if present: a group whose circuits are lit is granted without touching the switch;
- a job only touches ports it owns (claimed by its ranks' ``hello``).

Leases: when every member's acquire asks for one (``lease``), the grant is a *lease*: the members
keep the circuits across ops with no request at all, and the group's ports carry traffic (count as
busy) until the lease ends. A group that is ready but blocked only by leases *revokes* them: the
controller pushes ``revoke`` to every holder (``notify``); a holder answers with ``ack``, giving
the ops it ran under the lease and whether it is inside one (it then sends ``release`` when that op
completes). The lease ends, and its ports are free, once no holder is left and every member ran
the same number of ops: a member behind (a receiver whose sender already finished its sends, or a
peer that acked before entering the op another member is waiting in) runs the rest first, its next
``acquire`` being granted at once up to that count (``until``). Without that, a rank waiting inside
an op for a peer that acked and asks for the next round would wait forever, and circuits could go
dark under data still in flight. The next op after a lease re-acquires (barrier again).

Yields: a holder done with the group (provisioned mode: it announced another group next) gives its lease back
unasked with ``yield`` (the ops it ran under the lease), as the ack of a revoke not yet sent: it is no longer a
holder and the lease ends by the rule above, so once its last holder yielded the ports are free and a group
waiting on them switches with no revoke round trip. A rank that yielded and acquires the group again while the
lease stands and is not revoked (its prediction was wrong) is a holder again at once, as if it had never yielded
(``lease`` and its ``ops`` in the reply); once the lease is revoked or over, its acquire takes the paths above (a
member behind runs its remaining ops, else the next round). ``lease_yields`` counts them. The hello reply's
``yields`` tells a client this controller takes them (an older one would refuse the message).

Never granted before lit, never switched mid-switch: every change, a group's or an admin's
(``configure``), records per (device, port) it steers when its switch completes (``switching``, stored in
wall-clock time so a restarted controller still waits). A group using a port still switching is
granted only after that time; a change to such a port waits (a group's) or is refused (an admin's,
naming ``changes.<port>`` and when to retry). A port a change only darkens (its peer taken by another
port) is not steered (``ocs.moving_ports``: on a beam-steering OCS each port turns only for its own new
connection), so another change may steer it at once: two groups on one rail that each darken the other's
old peers switch together, not one delay after the other.

Tenancy and failures: ``register_job`` gives a job its secret (kept as a sha256), ``authenticate``
checks it (the server does, before ``hello``). A job registered with spares has idle spare ranks
(ids ``world..world+spares-1``); ``rank_failed`` moves a failed rank's identity to the lowest idle
spare, rewires the job's lit circuits and declared groups from the failed rank's ports to the spare's,
bumps the job's ``epoch``, wakes its waiters with :class:`Failover` and pushes ``failover``; with no
spare left it pushes ``dead``. ``hold`` lets a rank that reconnected inside an op keep its group, if its
circuits are lit now. ``port_failed`` marks a port dead: groups using it are refused plainly.

Cost: groups are indexed by job and by (device, port), and the groups that may be scheduled are kept
in a set, so a request looks only at groups on the ports it touches (``visits`` counts the groups
looked at; another tenant's groups do not add to it).

Grant timing (``grant_latency``, ``grant_overhead``, ``revoke_rtt``: :class:`Timings`, in the injected clock): per
group grant, the time from *ready* (the arrival of the last member's acquire of the round, the latest of the granted
waiters' arrival times) to the grant, by what the grant needed: ``switch`` if a switch for it completed after it was
ready (so the members waited for some of it), else ``revoke`` if a lease on ports it switches had to end after it was
ready, else ``lit``. For a switch, ``grant_overhead`` is that latency minus the part of the switch delay that fell
after ready (the whole delay unless a prepare started it earlier). A switch or revoke that was over before the last
member arrived (prepare hid it) counts as ``lit``: the circuits were there when every member was. Each revoke's
round trip is the time from its push to the end of the lease (last ack or release in). Skip-if-present grants a
lit group even while a lease holds the same circuits, so a revoke is needed only to switch: ``revoke`` has
samples only when another group's switch lit the circuits after the lease ended.

Storage: every durable change is written to the Store first; a failed write (another process holding
the lock past its bound) raises :class:`~lightrail.errors.InfeasibleError` naming ``state`` and leaves
memory, switches and disk as they were.

The controller is driven by its server (``server.py``) but does no I/O besides its Store and
the drivers; the clock and sleep are injected so tests can run it in virtual time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.protocol import Ack, Acquire, Bye, Group, Hello, Hold, Release, Yield
from lightrail.runtime.controller.store import Store
from lightrail.runtime.ocs import changed_ports, make_driver, moving_ports

__all__ = ["Controller", "Failover", "GroupState", "GroupStatus", "RankFailed", "Superseded", "Timings"]

_NEVER = float("-inf")  # a time before any: no switch, no revoke yet
_EPS = 1e-9  # seconds: a deadline this close counts as reached (float rounding of now + delay)
PERSISTED = ("grants", "unsafe_reconfigurations", "failovers")
"""Counters kept in the state file, so they sum over the controller's restarts (issue 31 item 7)."""
RESYNC_GRACE_S = 30.0  # after a restart: the client's reconnect bound (reconnect_timeout, docs/controller.md)


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


def _digest(token: object) -> str:
    return hashlib.sha256(token.encode() if isinstance(token, str) else b"").hexdigest()


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


class Controller:
    """Authoritative circuit state of every OCS and port ownership of every job (see module doc)."""

    def __init__(self, config: ControllerConfig, store: Store, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable] = asyncio.sleep, log: Callable[..., None] = lambda *a, **k: None,
                 notify: Callable[[str, int, dict], None] = lambda job, rank, message: None,
                 resync_grace: float = RESYNC_GRACE_S):
        self.config = config
        self.notify = notify  # (job, rank, message): push a message to the rank (the server writes it)
        self.store = store
        self.clock, self.sleep, self.log = clock, sleep, log
        self.wall = store.wall  # switching deadlines are stored in the store's wall clock
        self.devices = {d.name: make_driver(d.driver, name=d.name, ports=d.ports, delay_s=d.delay, duplex=d.duplex)
                        for d in config.devices}
        for device, state in store.circuits().items():
            if device in self.devices:
                self.devices[device].restore(state)
        self.jobs = store.jobs()
        self.tokens = store.tokens()  # job -> sha256 hex of its secret
        self.owner = {(d, p): job for job, info in self.jobs.items()
                      for ports in info["ranks"].values() for d, p in ports.items()}
        now, wall = clock(), self.wall()
        # (device, port) -> monotonic time its switch completes (restored: a restart still waits for it)
        self.switching: dict[tuple[str, int], float] = {k: now + (t - wall) for k, t in store.switching().items()}
        self.settled_by = max(self.switching.values(), default=0.0)  # every switch under way completes by then
        self.dead: set[tuple[str, int]] = store.dead_ports()
        # After a restart, groups and holders are gone (ranks re-declare them and send ``hold``), so a rank
        # may be inside an op on a lit circuit the controller does not know is held: the ports of every
        # restored rank are not switched until it resumes (its first acquire, prepare, release or ack,
        # which the client sends after its holds) or ``resync_grace`` seconds pass.
        self.unsynced: dict[tuple[str, int], tuple[str, int]] = {
            (d, p): (job, rank) for job, info in self.jobs.items() for rank, ports in info["ranks"].items()
            for d, p in ports.items()}
        self._unsynced_ports: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for k, who in self.unsynced.items():
            self._unsynced_ports.setdefault(who, []).append(k)
        self.resync_grace = resync_grace
        self.resync_until = now + resync_grace if self.unsynced else 0.0
        self.connected: set[tuple[str, int]] = set()  # ranks that said hello and did not leave or fail since
        self.groups: dict[tuple[str, str], GroupState] = {}
        self.job_groups: dict[str, dict[str, GroupState]] = {}  # index: job -> key -> group
        self.port_groups: dict[tuple[str, int], set[GroupState]] = {}  # index: (device, port) -> groups using it
        self._ready: set[GroupState] = set()  # groups that may be ready (a superset; _schedule prunes it)
        self._wakes: set[float] = set()  # deadlines a wake-up is pending for
        self.visits = 0  # groups looked at by scheduling and port checks (the work a request costs)
        self.intent: dict[tuple[str, int], str] = {}
        self.latencies: deque[float] = deque(maxlen=100_000)  # acquire -> grant, seconds
        # ready -> grant per group grant, by what it needed; a switch's minus its delay waited; revoke -> lease end
        self.grant_latency: dict[str, Timings] = {"lit": Timings(), "revoke": Timings(), "switch": Timings()}
        self.grant_overhead = Timings()
        self.revoke_rtt = Timings()
        self._lit = self.grant_latency["lit"]  # the common kind, without the lookup
        self.counters: dict[str, float] = {"requests": 0, "errors": 0, "grants": 0, "grants_without_change": 0,
                                           "leases": 0, "revocations": 0, "lease_yields": 0, "rejoins": 0,
                                           "unsafe_reconfigurations": 0, "failovers": 0}
        durable = store.counters()
        for k in PERSISTED:
            self.counters[k] = durable.get(k, 0.0)
        self._flushed = {k: self.counters[k] for k in PERSISTED}  # what the state file holds
        self._lease_ids = itertools.count(1)
        self._order = itertools.count(1)
        self.applies: deque[dict] = deque(maxlen=1000)  # recent reconfigurations, for the admin API and tests
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the server runs us on, and its thread
        self._loop_thread = 0
        self._current_loop()

    def _current_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop running in this thread, or None. ``asyncio.get_running_loop`` makes a getpid system call
        (~0.2-0.3 µs here, Python 3.11), twice per acquire on the hot path; the loop seen last, still running in
        this same thread, is that loop (one loop runs per thread), for a thread id and a flag (issue 17)."""
        loop = self._loop
        if loop is not None and self._loop_thread == threading.get_ident() and loop.is_running():
            return loop
        loop = _running_loop()
        if loop is not None:
            self._loop, self._loop_thread = loop, threading.get_ident()
        return loop

    def _off_loop(self, fn: Callable[[], None]) -> bool:
        """Called from another thread (the admin API's sync routes run in a worker thread): hand ``fn`` to
        the loop instead (it switches and starts timers there); True if so."""
        if self._current_loop() is not None:
            return False
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)
        return True

    # -- tenancy --------------------------------------------------------------------------------------
    def register_job(self, job: str, world: int, spares: int = 0) -> str:
        """A new job's secret token (only its sha256 is stored). Registering a job again is refused while
        any of its ranks is connected; once they are all gone it starts afresh (new token, no ranks)."""
        if not isinstance(job, str) or not job:
            raise ScenarioError(f"job must be a non-empty string, got {job!r}", field="job", fix='e.g. "train-1"')
        for name, value, low in (("world", world, 1), ("spares", spares, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ScenarioError(f"{name} must be an integer >= {low}, got {value!r}", field=name)
        limit = self.config.max_ranks_per_job
        if world + spares > limit:
            raise InfeasibleError(f"world {world} + spares {spares} is more than max_ranks_per_job = {limit}",
                                  field="world", fix="a smaller job, or raise max_ranks_per_job in the config")
        live = sorted(r for r in self.jobs.get(job, {}).get("ranks", {}) if (job, r) in self.connected)
        if live:
            raise InfeasibleError(f"job {job!r} is running ({len(live)} ranks connected)", field="job",
                                  fix=f"end it first (DELETE /jobs/{job}) or use another job name")
        token = secrets.token_urlsafe(32)
        digest = _digest(token)
        self.store.register_job(job, world, spares, digest)  # write first
        if job in self.jobs:
            self._forget_job(job)
        self.jobs[job] = {"world": world, "spares": spares, "epoch": 0, "ranks": {}}
        self.tokens[job] = digest
        self.log("register", job=job, world=world, spares=spares)
        return token

    def authenticate(self, job: str, token: str) -> bool:
        """True if ``token`` is ``job``'s secret (constant-time compare of the sha256 digests)."""
        want = self.tokens.get(job)
        return hmac.compare_digest(_digest(token), want if want is not None else "0" * 64) and want is not None

    # -- requests ---------------------------------------------------------------------------------------
    def hello(self, m: Hello) -> dict:
        job = self.jobs.get(m.job)
        if job is not None and job["world"] != m.world:
            raise ScenarioError(f"job {m.job!r} has world {job['world']}, not {m.world}", field="world",
                                fix="every rank of a job must give the same world size")
        spares = job.get("spares", 0) if job is not None else 0
        if getattr(m, "spare", False):
            if not m.world <= m.rank < m.world + spares:
                raise ScenarioError(f"spare rank {m.rank} is not one of job {m.job!r}'s {spares} spares", field="rank",
                                    fix=f"spares have ranks {m.world}..{m.world + spares - 1}" if spares else
                                    "register the job with spares (POST /jobs with spares >= 1)")
        elif m.rank >= m.world:
            raise ScenarioError(f"rank {m.rank} is outside world {m.world}", field="rank",
                                fix=f"use 0..{m.world - 1} (a spare says hello with spare=true)")
        known = job["ranks"].get(m.rank) if job is not None else None
        if known is None and job is not None and len(job["ranks"]) >= self.config.max_ranks_per_job:
            raise InfeasibleError(f"job {m.job!r} has {len(job['ranks'])} ranks, the limit "
                                  f"(max_ranks_per_job = {self.config.max_ranks_per_job})", field="max_ranks_per_job",
                                  fix="a smaller job, or raise max_ranks_per_job in the controller config")
        if known is not None and known != dict(m.ports) and job.get("epoch", 0) > 0:
            raise InfeasibleError(f"rank {m.rank} of job {m.job!r} is served by ports {known} since a failover "
                                  f"(epoch {job['epoch']})", field="ports",
                                  fix="a replaced rank does not come back; restart the job to use it again")
        for device, port in m.ports.items():
            self._check_port(device, port, field=f"ports.{device}")
            owner = self.owner.get((device, port))
            mine = known is not None and known.get(device) == port
            if owner is not None and not mine:
                raise InfeasibleError(f"port {port} on {device} is already owned by job {owner!r}",
                                      field=f"ports.{device}", fix="each NIC port belongs to one rank of one job")
        self.store.add_rank(m.job, m.world, m.rank, m.ports)  # write first
        job = self.jobs.setdefault(m.job, {"world": m.world, "spares": 0, "epoch": 0, "ranks": {}})
        for device, port in job["ranks"].get(m.rank, {}).items():
            self.owner.pop((device, port), None)
        job["ranks"][m.rank] = dict(m.ports)
        self.owner.update({(d, p): m.job for d, p in m.ports.items()})
        self.connected.add((m.job, m.rank))
        if getattr(m, "spare", False):
            self._resync(m.job, m.rank, schedule=False)  # an idle spare is inside no op
        self.log("hello", job=m.job, rank=m.rank, ports=m.ports)
        return {"registered": len(job["ranks"]), "world": m.world, "yields": True}  # it takes ``yield``

    def declare(self, m: Group) -> dict:
        job = self._job(m.job)
        outside = [r for r in m.members if r >= job["world"]]
        if outside:
            raise ScenarioError(f"member {outside[0]} is outside world {job['world']}", field="members")
        for device, circuits in m.circuits.items():
            driver = self._device(device, field=f"circuits.{device}")
            outputs = list(circuits.values())
            if len(set(outputs)) != len(outputs):
                o = next(o for o in outputs if outputs.count(o) > 1)
                raise InfeasibleError(f"two inputs on output {o} of {device}", field=f"circuits.{device}",
                                      fix="a configuration is a partial permutation: one input per output")
            for i, o in circuits.items():
                for port in (i, o):
                    self._check_port(device, port, field=f"circuits.{device}")
                    if self.owner.get((device, port)) != m.job:
                        raise InfeasibleError(f"port {port} on {device} is not owned by job {m.job!r}",
                                              field=f"circuits.{device}",
                                              fix="a job only touches ports its ranks claimed with hello")
                if driver.duplex and circuits.get(o) != i:
                    raise InfeasibleError(f"{device} is duplex: circuit {i}->{o} needs {o}->{i}",
                                          field=f"circuits.{device}", fix="declare both directions")
        key = (m.job, m.key)
        new = GroupState(m.job, m.key, m.phase, frozenset(m.members), {d: dict(c) for d, c in m.circuits.items() if c})
        old = self.groups.get(key)
        if old is not None:
            if (old.members, old.circuits) == (new.members, new.circuits):
                return {"key": m.key}  # idempotent (ranks re-declare after a reconnect or a failover)
            if not old.unused():
                raise ScenarioError(f"group {m.key!r} is already declared with other members or circuits, and is "
                                    f"in use ({old.status.value})", field="key",
                                    fix="use a new key for a different communicator, or re-declare it once idle")
            self._unindex(old)  # a changed declaration of an idle group replaces it
        else:
            limit = self.config.max_groups_per_job
            if len(self.job_groups.get(m.job, ())) >= limit:
                raise InfeasibleError(f"job {m.job!r} already declared {limit} groups, the limit "
                                      f"(max_groups_per_job = {limit})", field="max_groups_per_job",
                                      fix="reuse group keys, or raise max_groups_per_job in the controller config")
        self._index(new)
        return {"key": m.key}

    def acquire(self, m: Acquire) -> Waiter | None:
        """Ask for a group; returns a future resolved on grant (with None for a per-op grant, else the
        reply's lease fields), or None for a prepare (and for a repeated acquire by a rank that
        already holds the group). A repeated acquire replaces the rank's earlier wait, whose future
        fails with :class:`Superseded`."""
        g = self._group(m.job, m.key, m.rank)
        if self.dead:
            self._check_alive(g)
        if self.unsynced:
            self._resync(m.job, m.rank)
        freed = False
        previous = self.intent.get((m.job, m.rank))
        if previous is not None and previous != m.key:
            freed = self._leave(m.job, m.rank, previous)
        if m.rank in g.holders:
            if g.lease is None:
                self.intent[(m.job, m.rank)] = m.key
            if freed:
                self._schedule()
            return None
        self.intent[(m.job, m.rank)] = m.key
        op_no = getattr(m, "op_no", None)
        if m.op == "acquire" and getattr(m, "rejoin", False) and self._may_join(g, m.rank, op_no):
            fut = self._wait(g, m.rank)  # its grant of the round a peer restored by hold was lost: join it
            self._join(g, m.rank)
            if freed:
                self._schedule()
            return fut
        if g.lease is not None and m.op == "acquire" and m.rank in g.ops and (
                not g.revoking or g.started() > g.ops[m.rank]):
            fut = self._wait(g, m.rank)
            # yielded, and the lease is not revoked: a holder again, as if it never yielded; else (revoked) behind
            # the others: it runs the rest first
            self._rejoin(g, m.rank, behind=g.revoking)
            if freed:
                self._schedule()
            return fut
        g.intents.add(m.rank)
        complete = len(g.intents) == len(g.members)
        if complete and not g.ready_since:
            g.ready_since = self.clock()
        fut = None
        if m.op == "acquire":
            g.acquirers.add(m.rank)
            (g.lease_asks.add if m.lease else g.lease_asks.discard)(m.rank)
            if getattr(m, "rejoin", False):  # a later hold lets it join only a round in the same op (_may_join)
                g.rejoins[m.rank] = op_no
            else:
                g.rejoins.pop(m.rank, None)
            fut = self._wait(g, m.rank)
        # Only a completed barrier or freed ports can make anything new possible. A rank back while
        # the group is still granted waits for the next round (the last release reschedules).
        if complete and not freed and self._grant_at_once(g):
            return fut
        if complete:
            self._ready.add(g)
        if complete or freed:
            self._schedule()
        return fut

    def release(self, m: Release) -> dict:
        g = self._group(m.job, m.key, m.rank)
        if self.unsynced:
            self._resync(m.job, m.rank)
        if g.lease is not None and m.rank in g.holders:
            if m.rank not in g.limit:
                raise ScenarioError(f"rank {m.rank} holds lease {g.lease} of {m.key!r}: it ends with ack, after a "
                                    f"revoke", field="key", fix="keep the lease until the controller revokes it")
            g.ops[m.rank] = g.limit.pop(m.rank)  # the op it was inside (or the ops it rejoined for) completed
            g.holders.discard(m.rank)
            if self._lease_progress(g):
                self._schedule()
            return {}
        if self.intent.get((m.job, m.rank)) == m.key and self._leave(m.job, m.rank, m.key):
            self._schedule()
        return {}

    def ack(self, m: Ack) -> dict:
        """A holder answers a revoke; a stale ack (another lease, or already answered) changes nothing."""
        g = self._group(m.job, m.key, m.rank)
        self._resync(m.job, m.rank)
        if g.lease != m.lease or not g.revoking or m.rank not in g.holders or m.rank in g.limit:
            return {"stale": True}
        if m.inside:  # inside op number ``ops``: it releases when that op completes
            g.limit[m.rank] = m.ops
        else:
            g.ops[m.rank] = m.ops
            g.holders.discard(m.rank)
        if self._lease_progress(g):
            self._schedule()
        return {}

    def yield_lease(self, m: Yield) -> dict:
        """A holder gives its lease back before any revoke (see module doc): taken as the ack of a revoke not yet
        sent (after one, as its ack). A stale yield (another lease, already given back, or inside an op after
        answering a revoke) changes nothing."""
        g = self._group(m.job, m.key, m.rank)
        if self.unsynced:
            self._resync(m.job, m.rank)
        if g.lease != m.lease or m.rank not in g.holders or m.rank in g.limit:
            return {"stale": True}
        g.ops[m.rank] = m.ops
        g.holders.discard(m.rank)
        self.counters["lease_yields"] += 1
        if self._lease_progress(g):
            self._schedule()
        return {}

    def hold(self, job: str | Hold, rank: int | None = None, key: str | None = None, op_no: int | None = None,
             first: bool = False) -> dict:
        """A rank that reconnected (after a controller restart) inside an op on ``key``: it holds the group
        again, granted with its declared circuits, but only if they are lit now (no port dark, switching
        or dead); otherwise an error naming ``key`` (the rank then acquires it). Takes (job, rank, key,
        op_no, first) or the :class:`Hold` message; ``op_no`` (the op it is inside) decides which rejoining
        acquires join the restored round. A ``first`` hold (in place of a lease acquire: the rank is not
        inside the op yet) joins only a round restored by hold with a holder inside that op; otherwise the
        reply is ``held: false`` and the rank acquires. Granted on lit circuits alone, every op after a restart
        would be a hold: no barrier, and never a lease again for the rest of the job."""
        if isinstance(job, Hold):
            job, rank, key, op_no, first = job.job, job.rank, job.key, job.op_no, job.first
        g = self._group(job, key, rank)
        self._check_alive(g)
        # Unlike a rejoining acquire (_may_join), a rank that held an earlier op of the round may join it again:
        # a lease's members can be an op apart, and a peer inside the next op waits for this rank's part of it.
        if first and not self._restored_for(g, op_no):
            return {"held": False}  # an answer, not an error: every lease op's first try after a restart gets it
        now = self.clock()
        dark = [f"{d}:{i}->{o}" for d, c in g.circuits.items() for i, o in c.items()
                if self.devices[d].state().get(i) != o]
        lit_at = self._lit_at(g)
        if dark or g.status == GroupStatus.APPLYING or lit_at > now + _EPS:
            why = f"circuit {dark[0]} is not lit" if dark else f"its ports are switching for {lit_at - now:.3f} s"
            raise InfeasibleError(f"group {key!r} cannot be held: {why}", field="key",
                                  fix="acquire it again (the controller lights it)")
        previous = self.intent.get((job, rank))
        freed = previous is not None and previous != key and self._leave(job, rank, previous)
        waiter = g.waiters.pop(rank, None)
        if waiter is not None and not waiter[0].done():
            waiter[0].set_exception(Superseded(f"rank {rank} holds {key!r} (hold)", field="key"))
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        g.rejoins.pop(rank, None)
        if g.status != GroupStatus.GRANTED:
            g.restored = set()  # a round restored by hold (not one this controller granted)
            g.restored_ops = set()
        g.holders.add(rank)
        g.status = GroupStatus.GRANTED
        if g.restored is not None:
            g.restored.add(rank)
            if op_no is None:
                g.restored_ops = None  # an older client's hold: its op is unknown, so any rejoin joins (as before)
            elif g.restored_ops is not None:
                g.restored_ops.add(op_no)
        if g.lease is None:  # a per-op holder (a lease is tracked by its holders alone)
            g.intents.add(rank)
            self.intent[(job, rank)] = key
        self.log("hold", job=job, rank=rank, group=key)
        for r in sorted(g.rejoins):  # rejoining acquires that arrived before this hold join the round now
            if r in g.waiters and self._may_join(g, r, g.rejoins[r]):
                self._join(g, r)
        if freed:
            self._schedule()
        return {"key": key, "holders": sorted(g.holders)}

    def lease_of(self, job: str, key: str, rank: int) -> int | None:
        """The lease ``rank`` holds on the group, if its round is a lease."""
        g = self.groups.get((job, key))
        return g.lease if g is not None and rank in g.holders else None

    def bye(self, m: Bye) -> dict:
        job = self._job(m.job)
        if m.rank is not None:
            if m.rank not in job["ranks"]:
                raise ScenarioError(f"rank {m.rank} of job {m.job!r} is not registered", field="rank")
            if len(job["ranks"]) > 1:
                self.store.remove_rank(m.job, m.rank)  # write first
                self._resync(m.job, m.rank, schedule=False)
                self.disconnect(m.job, m.rank)
                for device, port in job["ranks"].pop(m.rank).items():
                    self.owner.pop((device, port), None)
                return {"remaining": len(job["ranks"])}
        self.store.remove_job(m.job)  # write first
        self._forget_job(m.job)
        del self.jobs[m.job]
        self.tokens.pop(m.job, None)
        self._schedule()
        return {"remaining": 0}

    def disconnect(self, job: str, rank: int) -> None:
        """A rank's connection closed: it no longer holds or waits for anything (its leases vanish). It
        stays registered (its ports stay its own), so it can come back."""
        self.connected.discard((job, rank))
        key = self.intent.get((job, rank))
        freed = key is not None and self._leave(job, rank, key)
        for g in [g for g in self.job_groups.get(job, {}).values() if g.lease is not None]:
            if rank in g.holders or rank in g.ops:
                g.holders.discard(rank)
                g.ops.pop(rank, None)
                g.limit.pop(rank, None)
                freed = self._lease_progress(g) or freed
        if freed:
            self._schedule()

    def connection_lost(self, job: str, rank: int) -> None:
        """The rank's connection closed without bye: it may be gone or reconnecting (after a pause of this
        process, a dropped connection), and the server fails it only if it says no hello again in time. Its
        holds, leases and waits go, as :meth:`disconnect` drops them (its client forgets its leases and sends its
        holds and waiting requests again on the new connection, as after a restart), but it stays a member, and
        its ports are not switched until it resumes (its first acquire, prepare, release or ack, sent after its
        holds) or ``resync_grace`` passes: it may still be inside an op on them."""
        ports = self.jobs.get(job, {}).get("ranks", {}).get(rank)
        if ports is None or (job, rank) not in self.connected:
            return
        keys = [(d, p) for d, p in ports.items()]
        for k in keys:
            self.unsynced[k] = (job, rank)
        self._unsynced_ports[(job, rank)] = keys
        self.resync_until = max(self.resync_until, self.clock() + self.resync_grace)
        self.disconnect(job, rank)
        self.connected.add((job, rank))

    def rank_failed(self, job: str, rank: int) -> dict:
        """A rank died (connection closed without bye, or heartbeats stopped). With an idle spare, the
        spare takes its place (see module doc); with spares but none left, the job is told it is dead;
        a job registered without spares keeps :meth:`disconnect`'s behaviour."""
        info = self._job(job)
        if rank not in info["ranks"]:
            raise ScenarioError(f"rank {rank} of job {job!r} is not registered", field="rank")
        if (job, rank) not in self.connected:
            return {"failover": False}  # already failed, left or replaced: nothing more to do
        if not info.get("spares") or rank >= info["world"]:
            self._resync(job, rank, schedule=False)  # gone: its ports may be switched
            self.disconnect(job, rank)  # no spares, or an idle spare that died: nothing to move
            return {"failover": False}
        failed = info["ranks"][rank]
        spare = next((s for s in sorted(info["ranks"]) if s >= info["world"] and (job, s) in self.connected
                      and set(info["ranks"][s]) >= set(failed)
                      and not any((d, p) in self.dead for d, p in info["ranks"][s].items())), None)
        if spare is None:
            reason = f"rank {rank} failed and job {job!r} has no idle spare left"
            self._resync(job, rank, schedule=False)
            self.disconnect(job, rank)
            self._wake_job(job, RankFailed(reason, field="rank", fix="restart the job from its last checkpoint"))
            self.log("dead", job=job, rank=rank)
            for r in sorted(info["ranks"]):
                if (job, r) in self.connected:
                    self.notify(job, r, {"op": "dead", "job": job, "rank": rank, "reason": reason})
            return {"failover": False}
        moved = {d: (failed[d], info["ranks"][spare][d]) for d in failed}  # device -> (failed port, spare port)
        epoch = info.get("epoch", 0) + 1
        self._resync(job, rank, schedule=False)  # a dead rank carries no traffic (an idle spare none either)
        self._resync(job, spare, schedule=False)
        plan = self._rewire_plan(job, moved)
        now, wall = self.clock(), self.wall()
        until = {(d, p): wall + self.devices[d].delay_s for d, (_, _, ins, outs) in plan.items() for p in ins | outs}
        counters = {k: v for d, (c, _, _, _) in plan.items()
                    for k, v in ((f"reconfigurations:{d}", 1), (f"circuit_changes:{d}", len(c)))}
        counters["failovers"] = 1
        self.store.failover(job, rank, spare, epoch, {d: after for d, (_, after, _, _) in plan.items()}, until,
                            counters)  # write first
        # memory: the job's groups start a fresh round on the new ports (its ranks rebuild and re-acquire)
        self.connected.discard((job, rank))
        self._wake_job(job, Failover(f"rank {rank} of job {job!r} failed; spare {spare} takes its place "
                                     f"(epoch {epoch})", field="rank", fix="re-declare the groups and acquire again"))
        for g in list(self.job_groups.get(job, {}).values()):
            circuits = {d: {moved[d][1] if i == moved[d][0] else i: moved[d][1] if o == moved[d][0] else o
                            for i, o in c.items()} if d in moved else c for d, c in g.circuits.items()}
            circuits = {d: {i: o for i, o in c.items() if i != o} for d, c in circuits.items()}
            if circuits != g.circuits:
                self._unindex(g)
                g.circuits = {d: c for d, c in circuits.items() if c}
                g.__post_init__()
                self._index(g)
        rewire_s = 0.0
        for device, (c, _, ins, outs) in plan.items():
            done = self.devices[device].apply(c, now)
            self._mark_switching(device, ins | outs, done)
            rewire_s = max(rewire_s, done - now)
            self.applies.append({"device": device, "group": None, "job": job, "phase": "failover", "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": [], "busy_outputs": []})
        for device, (port, _) in moved.items():
            self.owner.pop((device, port), None)
        self.counters["failovers"] += 1
        self._flushed["failovers"] += 1  # written with the failover
        ranks = info["ranks"]
        ranks[rank] = ranks.pop(spare)
        info["epoch"] = epoch
        self.connected.discard((job, spare))  # the server re-binds the spare's connection to ``rank`` (it
        self.connected.add((job, rank))  # says hello again as it): if it dies too, the next spare follows
        self.log("failover", job=job, rank=rank, spare=spare, epoch=epoch, rewire_s=rewire_s)
        message = {"op": "failover", "job": job, "rank": rank, "spare": spare, "epoch": epoch,
                   "ports": dict(ranks[rank])}
        for r in sorted({*ranks, spare} - {rank}):
            if (job, r) in self.connected or r == spare:
                self.notify(job, r, message)
        if rewire_s > 0:
            self._wake_at(now + rewire_s)
        self._schedule()
        return {"failover": True, "spare": spare, "epoch": epoch, "rewire_s": rewire_s}

    def flush_counters(self) -> None:
        """Write what the persisted counters (:data:`PERSISTED`) gained since the last flush (the server calls this
        every sweep and when it stops; a grant is not worth a write of its own)."""
        gained = {k: self.counters[k] - self._flushed[k] for k in PERSISTED if self.counters[k] != self._flushed[k]}
        if gained:
            self.store.add_counters(gained)
            self._flushed.update({k: self.counters[k] for k in gained})

    def port_failed(self, device: str, port: int) -> dict:
        """The operator marks a port dead (persisted): groups using it are refused, their waiters woken,
        and the owning job's connected ranks told (``port_failed``)."""
        self._check_port(device, port, field="port")
        self.store.set_dead(device, port, True)  # write first
        self.dead.add((device, port))
        error = self._dead_error(device, port)
        groups = sorted(self.port_groups.get((device, port), ()), key=lambda g: (g.job, g.key))
        for g in groups:
            self._fail_waiters(g, error)
        jobs = {g.job for g in groups} | ({self.owner[(device, port)]} if (device, port) in self.owner else set())
        for job in sorted(jobs):
            for r in sorted(self.jobs.get(job, {}).get("ranks", {})):
                if (job, r) in self.connected:
                    self.notify(job, r, {"op": "port_failed", "job": job, "device": device, "port": port})
        self.log("port_failed", device=device, port=port, groups=len(groups))
        return {"device": device, "port": port, "dead": True, "groups": [f"{g.job}/{g.key}" for g in groups]}

    def port_repaired(self, device: str, port: int) -> dict:
        """Undo :meth:`port_failed` (persisted)."""
        self._check_port(device, port, field="port")
        self.store.set_dead(device, port, False)  # write first
        self.dead.discard((device, port))
        self.log("port_repaired", device=device, port=port)
        return {"device": device, "port": port, "dead": False}

    def configure(self, device: str, changes: dict[int, int | None], *, job: str | None = None) -> dict:
        """Admin change of one device's circuits (validated; nothing changes on error). A change to a port
        still switching is refused, naming the port and when to retry."""
        driver = self._device(device, field="device")
        for port in set(changes) | {o for o in changes.values() if o is not None}:
            self._check_port(device, port, field=f"changes.{port}")
        after = driver.validate(changes)
        ins, outs = changed_ports(driver.state(), after)
        for port in sorted(ins | outs):  # every port the change switches, not only the ones it names
            owner = self.owner.get((device, port))
            if owner is not None and owner != job:
                raise InfeasibleError(f"port {port} on {device} is owned by job {owner!r}", field=f"changes.{port}",
                                      fix="only the owning job's ports can be switched (give job=...)")
        for i, o in sorted(changes.items()):
            for port in (i, o):
                if o is not None and (device, port) in self.dead:
                    raise InfeasibleError(f"port {port} on {device} is dead", field=f"changes.{i}",
                                          fix=f"re-plan without it (or POST /devices/{device}/ports/{port}/repair)")
        now = self.clock()
        steered = set().union(*moving_ports(driver.state(), after))
        for port in sorted(ins | outs):
            until = self._switching_until(device, [port])
            if until > now + _EPS:
                why = "is still switching" if self.switching.get((device, port), 0.0) > now + _EPS else \
                    f"may carry traffic (rank {self.unsynced[(device, port)][1]} of job " \
                    f"{self.unsynced[(device, port)][0]!r} has not resumed since the controller restarted)"
                raise InfeasibleError(f"port {port} on {device} {why} ({until - now:.3f} s left)",
                                      field=f"changes.{port}", fix=f"retry after {until - now:.3f} s")
        hot_in, hot_out = self._used(device, ins, outs, GroupState.active)
        if hot_in or hot_out:
            port = min(hot_in | hot_out)
            raise InfeasibleError(f"port {port} on {device} carries traffic", field=f"changes.{port}",
                                  fix="wait until its group is released")
        switched = steered
        if ins | outs:
            wall = self.wall()
            self.store.switch({device: after}, {(device, p): wall + driver.delay_s for p in switched},
                              {f"reconfigurations:{device}": 1, f"circuit_changes:{device}": len(ins)})  # write first
        done = driver.apply(changes, now)
        if ins | outs:
            self._mark_switching(device, switched, done)
            self.applies.append({"device": device, "group": None, "job": job, "phase": "admin", "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": [], "busy_outputs": []})
            self.log("configure", device=device, job=job, delay_s=done - now)
            self._schedule()  # a group lit by this change waits for its deadline
        return {"device": device, "completes_in_s": done - now, "circuits": driver.state()}

    # -- scheduling -------------------------------------------------------------------------------------
    def _used(self, device: str, ins: set[int], outs: set[int],
              busy: Callable[[GroupState], bool]) -> tuple[set[int], set[int]]:
        """Of ``ins`` and ``outs``, the ports a group for which ``busy(group)`` holds uses (as an input, an
        output), found through the port index: only the groups on those ports are looked at."""
        hot_in: set[int] = set()
        hot_out: set[int] = set()
        verdict: dict[GroupState, bool] = {}
        for p in ins | outs:
            for h in self.port_groups.get((device, p), ()):
                self.visits += 1
                h_in, h_out = h.ports()[device]
                as_in, as_out = p in ins and p in h_in, p in outs and p in h_out
                if not (as_in or as_out):
                    continue
                if h not in verdict:
                    verdict[h] = busy(h)
                if verdict[h]:
                    if as_in:
                        hot_in.add(p)
                    if as_out:
                        hot_out.add(p)
        return hot_in, hot_out

    def _hot(self, device: str, changes: dict[int, int | None], busy) -> tuple[set[int], set[int]]:
        """Inputs and outputs that ``changes`` would switch while a group with ``busy(group)`` uses them."""
        driver = self.devices[device]
        ins, outs = changed_ports(driver.state(), driver.validate(changes))
        return self._used(device, ins, outs, busy)

    def _switching_until(self, device: str, ports) -> float:
        """When the last switch under way on any of ``ports`` completes (a switch marks the ports it steers,
        ``moving_ports``, not those it only darkens), or, after a restart, when a port of a rank that has not
        resumed may be switched (0: now)."""
        until = max((self.switching.get((device, p), 0.0) for p in ports), default=0.0)
        if self.unsynced and self.clock() < self.resync_until and any((device, p) in self.unsynced for p in ports):
            until = max(until, self.resync_until)
        return until

    def _resync(self, job: str, rank: int, *, schedule: bool = True) -> None:
        """The rank resumed after a restart (it sent its holds), left or failed: its ports may be switched."""
        ports = self._unsynced_ports.pop((job, rank), None) if self.unsynced else None
        if ports:
            for k in ports:
                self.unsynced.pop(k, None)
            if schedule:
                self._schedule()

    def _grant_at_once(self, g: GroupState) -> bool:
        """Grant ``g``, whose members all acquired just now, if it is the only group that may be ready and it is
        lit and settled: what :meth:`_schedule` would do, without its pass over the ready set (the hot path of a
        lit per-op round at 1,024 ranks, issue 17). False (nothing done) in every other case."""
        if self._ready or self.dead or g.status != GroupStatus.IDLE or len(g.acquirers) != len(g.members) \
                or not self._settled(g):
            return False
        self.counters["grants_without_change"] += 1
        self._grant(g)
        return True

    def _settled(self, g: GroupState) -> bool:
        """``g``'s circuits are lit, and no change on its ports is still settling: it may be granted now."""
        return not self._changes(g) and self._lit_at(g) <= self.clock() + _EPS

    def _lit_at(self, g: GroupState) -> float:
        """When every port of ``g``'s circuits has settled (0: they have)."""
        if self.settled_by <= self.clock():
            return 0.0  # nothing is switching anywhere (the common case: no lookup per port)
        return max((self.switching.get(k, 0.0) for k in g.port_keys()), default=0.0)

    def _mark_switching(self, device: str, ports, done: float) -> None:
        """Record when the switch of ``ports`` completes (one entry per port: bounded by the fabric)."""
        for p in ports:
            self.switching[(device, p)] = max(self.switching.get((device, p), 0.0), done)
        self.settled_by = max(self.settled_by, done)

    def _wake_at(self, t: float) -> None:
        """Run the scheduler again at ``t`` (a port's switch completes then; no request may come)."""
        if t in self._wakes or self._off_loop(lambda: self._wake_at(t)):
            return
        self._wakes.add(t)

        async def wake() -> None:
            try:
                await self.sleep(max(0.0, t - self.clock()))
            finally:
                self._wakes.discard(t)
            self._schedule()

        task = asyncio.get_running_loop().create_task(wake())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _changes(self, g: GroupState) -> dict[str, dict[int, int | None]]:
        """Per device, the change set that lights ``g``'s circuits (darkening inputs on its outputs)."""
        out = {}
        for device, circuits in g.circuits.items():
            driver = self.devices[device]
            state = driver.lit()
            for i, o in circuits.items():
                if state.get(i) != o:
                    break
            else:
                continue  # all lit (so no other input on its outputs): skip if present, the common case
            by_output = {o: i for i, o in state.items()}
            changes: dict[int, int | None] = {}
            for i, o in circuits.items():
                other = by_output.get(o)
                if other is not None and other != i and other not in circuits:
                    changes[other] = None
                if state.get(i) != o:
                    changes[i] = o
            if driver.duplex:  # darkening one direction of a duplex pair darkens both
                for i in [i for i, o in changes.items() if o is None]:
                    peer = state.get(i)
                    if peer is not None and peer not in circuits:
                        changes[peer] = None
            if changes:
                out[device] = changes
        return out

    def _soft(self, g: GroupState) -> bool:
        """Lit for members that all asked but have not all acquired yet (prepared): only a group whose
        members all acquired may take its ports, so two prepared groups never switch the fabric back
        and forth."""
        return (g.status == GroupStatus.IDLE and len(g.intents) == len(g.members)
                and len(g.acquirers) < len(g.members) and not self._changes(g))

    def _schedule(self) -> None:
        """Light every group whose members all asked and whose change switches no busy or still-switching
        port (the switch changes at once, the group is granted after the delay); grant the lit groups
        whose members all acquired and whose ports have settled."""
        if not self._ready or self._off_loop(self._schedule):
            return  # nothing may be ready, or another thread asked: the loop runs it
        self.visits += len(self._ready)
        ready = [g for g in self._ready if g.ready() and self.groups.get((g.job, g.key)) is g]
        self._ready = set(ready)
        if not ready:
            return
        if len(ready) > 1:
            ready.sort(key=lambda g: (g.ready_since, g.order))
        now = self.clock()
        for g in ready:
            if not g.ready():
                continue
            if self.dead and g.port_keys() & self.dead:
                d, p = min(g.port_keys() & self.dead)
                self._fail_waiters(g, self._dead_error(d, p))
                continue
            changes = self._changes(g)
            acquired = len(g.acquirers) == len(g.members)
            if not changes:
                if acquired:
                    lit_at = self._lit_at(g)
                    if lit_at > now + _EPS:  # lit, but a change on its ports (an admin's) is still settling
                        self._wake_at(lit_at)
                        continue
                    self.counters["grants_without_change"] += 1
                    self._grant(g)
                continue  # lit; its prepared members will acquire it
            busy = GroupState.active if acquired else (lambda h: h.active() or self._soft(h))
            if any(any(self._hot(d, c, busy)) for d, c in changes.items()):
                if not acquired and any(any(self._hot(d, c, self._soft)) for d, c in changes.items()):
                    continue  # lit for another prepared group: wait (no thrash)
                self._revoke_for(g, changes)
                continue  # a port it switches carries traffic: wait (for the release, or the revoked leases)
            until = max(self._switching_until(d, set().union(*changed_ports(self.devices[d].state(),
                                                                              self.devices[d].validate(c))))
                        for d, c in changes.items())
            if until > now + _EPS:
                self._wake_at(until)  # a port it changes is still being steered: never switch mid-switch
                continue
            self._switch(g, changes)

    def _revoke_for(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Revoke the leases that keep ``g`` waiting, if nothing else does (a per-op round in use or a
        change under way is waited for; its leases are revoked once it is over)."""
        leases: list[GroupState] = []
        for d, c in changes.items():
            driver = self.devices[d]
            ins, outs = changed_ports(driver.state(), driver.validate(c))
            seen: set[GroupState] = set()
            for p in ins | outs:
                for h in self.port_groups.get((d, p), ()):
                    self.visits += 1
                    if h is g or h in seen or not h.active():
                        continue
                    h_in, h_out = h.ports()[d]
                    if (p in ins and p in h_in) or (p in outs and p in h_out):
                        seen.add(h)
                        if h.status != GroupStatus.GRANTED or h.lease is None:
                            return
                        if h not in leases:
                            leases.append(h)
        if leases:
            g.revoked_at = self.clock()  # it waits for a lease to end (grant timing: ``revoke`` if this is after ready)
        for h in leases:
            if not h.revoking:
                h.revoking = True
                h.revoke_pushed = self.clock()
                self.counters["revocations"] += 1
                self.log("revoke", job=h.job, group=h.key, lease=h.lease, holders=sorted(h.holders), wanted_by=g.key)
                for rank in sorted(h.holders):
                    self.notify(h.job, rank, {"op": "revoke", "job": h.job, "rank": rank, "key": h.key,
                                              "lease": h.lease})

    def _switch(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Change the switches now (so every later decision sees the new state); grant after the delay.
        The store is written first: if it fails, nothing changes and the group's waiters get the error."""
        now, wall = self.clock(), self.wall()
        plan = {}
        for device, c in changes.items():
            driver = self.devices[device]
            after = driver.validate(c)
            ins, outs = changed_ports(driver.state(), after)
            plan[device] = (c, after, ins, outs, set().union(*moving_ports(driver.state(), after)))
        until = {(d, p): wall + self.devices[d].delay_s for d, (*_, steered) in plan.items() for p in steered}
        counters: dict[str, float] = {"reconfiguration_seconds": max(self.devices[d].delay_s for d in plan)}
        for d, (c, *_) in plan.items():
            counters[f"reconfigurations:{d}"] = 1
            counters[f"circuit_changes:{d}"] = len(c)
        try:
            self.store.switch({d: after for d, (_, after, *_) in plan.items()}, until, counters)
        except InfeasibleError as e:
            self._fail_waiters(g, e)
            return
        done = now
        for device, (c, _, ins, outs, steered) in plan.items():
            driver = self.devices[device]
            b_in, b_out = self._used(device, ins, outs, GroupState.active)  # independent of _schedule's check
            if b_in or b_out or self._switching_until(device, ins | outs) > now + _EPS:
                self.counters["unsafe_reconfigurations"] += 1  # never happens: _schedule checked it
            d_done = driver.apply(c, now)
            done = max(done, d_done)
            self._mark_switching(device, steered, d_done)
            self.applies.append({"device": device, "group": g.key, "job": g.job, "phase": g.phase, "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": sorted(b_in), "busy_outputs": sorted(b_out)})
        self.log("reconfigure", job=g.job, group=g.key, phase=g.phase, devices=sorted(changes), delay_s=done - now)
        g.status = GroupStatus.APPLYING
        g.switch_start, g.switch_done = now, done
        task = asyncio.get_running_loop().create_task(self._settle(g, done - now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, g: GroupState, delay: float) -> None:
        if delay > 0:
            await self.sleep(delay)
        if g.status == GroupStatus.APPLYING:
            g.status = GroupStatus.IDLE
            self._ready.add(g)
            alive = not (self.dead and g.port_keys() & self.dead)
            if len(g.acquirers) == len(g.members) and self._settled(g) and alive:
                self._grant(g)  # every member is waiting for it
        self._schedule()

    def _grant(self, g: GroupState) -> None:
        g.status = GroupStatus.GRANTED
        g.restored, g.restored_ops, g.rejoins = None, None, {}
        g.holders = set(g.acquirers)
        g.acquirers = set()  # acquires from now on are for the next round
        g.ready_since = 0.0
        reply = None
        if g.holders <= g.lease_asks:  # every member asked for a lease
            g.lease, g.revoking = next(self._lease_ids), False
            g.ops, g.limit = {}, {}
            g.intents -= g.holders  # the lease is tracked by its holders; an acquire now is for the next round
            for rank in g.holders:
                if self.intent.get((g.job, rank)) == g.key:
                    del self.intent[(g.job, rank)]
            reply = {"lease": g.lease}
            self.counters["leases"] += 1
        g.lease_asks = set()
        now = self.clock()
        ready = _NEVER  # when the last member's acquire arrived
        for rank in g.holders:
            fut, asked = g.waiters.pop(rank)
            if asked > ready:
                ready = asked
            if not fut.done():
                fut.set_result(reply)
                self.latencies.append(now - asked)
        self.counters["grants"] += 1
        if g.switch_done < ready and g.revoked_at < ready:  # lit (times left from before ready never count)
            self._lit.add(now - ready)
        elif ready == _NEVER:
            return  # no member (nothing to time)
        elif g.switch_done >= ready:  # a switch for it was not over when every member was there
            waited = min(g.switch_done, now) - max(g.switch_start, ready)  # its delay after ready (<= the delay)
            self.grant_latency["switch"].add(now - ready)
            self.grant_overhead.add(now - ready - max(0.0, waited))
            g.switch_start = g.switch_done = g.revoked_at = _NEVER
        else:
            self.grant_latency["revoke"].add(now - ready)
            g.revoked_at = _NEVER

    def _rejoin(self, g: GroupState, rank: int, *, behind: bool = True) -> None:
        """A member behind the others in a revoked lease runs its remaining ops at once, up to ``until``
        (the ports stay busy; the members ahead of it are waiting for, or have sent, those ops). Not ``behind``:
        a member that yielded a lease not revoked is a holder again, with no limit (as if it never yielded)."""
        fut, asked = g.waiters.pop(rank)
        g.intents.discard(rank)
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        if len(g.intents) < len(g.members):
            g.ready_since = 0.0
        if self.intent.get((g.job, rank)) == g.key:
            del self.intent[(g.job, rank)]
        g.holders.add(rank)
        reply = {"lease": g.lease}
        if behind:
            reply["until"] = g.limit[rank] = g.started()
            self.counters["rejoins"] += 1
        reply["ops"] = g.ops.pop(rank)
        self.latencies.append(self.clock() - asked)
        if not fut.done():
            fut.set_result(reply)

    @staticmethod
    def _may_join(g: GroupState, rank: int, op_no: int | None) -> bool:
        """A rejoining acquire joins at once: the group is granted per op in a round restored by ``hold``,
        ``rank`` has not been in that round, and its op is one a holder is inside (a peer is inside the op
        this rank's lost grant was for). An acquire for a later op (its release and next acquire were both
        lost in the kill) waits for the next round: joining this one would run its op early and leave the
        peer's own acquire for that op waiting on a round that never ends (issue 17 item 3). An unknown
        number (either side an older client) joins, as before op numbers."""
        return Controller._restored_for(g, op_no) and rank not in g.restored and rank not in g.holders

    @staticmethod
    def _restored_for(g: GroupState, op_no: int | None) -> bool:
        """The group is granted per op in a round restored by ``hold`` with a holder inside op ``op_no`` (or
        either side does not know its op: an older client)."""
        return (g.status == GroupStatus.GRANTED and g.lease is None and g.restored is not None
                and (op_no is None or g.restored_ops is None or op_no in g.restored_ops))

    def _join(self, g: GroupState, rank: int) -> None:
        """Grant ``rank``'s waiting acquire inside the restored round (its circuits are lit: it was held)."""
        fut, asked = g.waiters.pop(rank)
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        g.rejoins.pop(rank, None)
        g.holders.add(rank)
        g.restored.add(rank)
        g.intents.add(rank)
        self.intent[(g.job, rank)] = g.key
        self.counters["rejoins"] += 1
        self.latencies.append(self.clock() - asked)
        self.log("rejoin", job=g.job, rank=rank, group=g.key)
        if not fut.done():
            fut.set_result({"rejoined": True})

    def _lease_progress(self, g: GroupState) -> bool:
        """After an ack, release or disconnect in a lease: let members behind rejoin; end the lease once no
        holder is left and every member ran the same ops. True if that freed its ports."""
        if g.lease is None:
            return False
        started = g.started()
        for rank in [r for r in g.waiters if r in g.ops and r not in g.holders and started > g.ops[r]]:
            self._rejoin(g, rank)
        if g.holders or len(set(g.ops.values())) > 1:
            return False  # someone is still inside, has not answered, or must run its remaining ops
        if g.revoking:
            self.revoke_rtt.add(self.clock() - g.revoke_pushed)
        g.status, g.lease, g.revoking, g.ops, g.limit = GroupStatus.IDLE, None, False, {}, {}
        self._ready.add(g)
        if g.intents and len(g.intents) == len(g.members):
            g.ready_since = self.clock()
        return True

    def _leave(self, job: str, rank: int, key: str) -> bool:
        """The rank no longer wants or holds the group; True if that freed ports (its round ended, or
        it was lit for members that all asked)."""
        self.intent.pop((job, rank), None)
        g = self.groups.get((job, key))
        if g is None:
            return False
        was_complete = len(g.intents) == len(g.members)
        g.intents.discard(rank)
        g.acquirers.discard(rank)
        g.holders.discard(rank)
        waiter = g.waiters.pop(rank, None)
        if waiter is not None and not waiter[0].done():
            waiter[0].cancel()
        if len(g.intents) < len(g.members):
            g.ready_since = 0.0
        g.rejoins.pop(rank, None)
        if g.status == GroupStatus.GRANTED and not g.holders and g.lease is None:
            g.status = GroupStatus.IDLE  # the round is over; ranks already back wait for the next barrier
            g.restored, g.restored_ops = None, None
            if len(g.intents) == len(g.members):
                g.ready_since = self.clock()
                self._ready.add(g)
            return True
        return g.status == GroupStatus.IDLE and was_complete  # its lit-for-prepare ports are no longer reserved

    def _wait(self, g: GroupState, rank: int) -> Waiter:
        """A blocked acquire's future; an earlier one of the same rank on ``g`` fails with Superseded."""
        loop = self._current_loop()
        if loop is None:
            raise RuntimeError("no running event loop")  # as asyncio.get_running_loop says it
        fut = Waiter(loop=loop)
        old = g.waiters.get(rank)
        if old is not None and not old[0].done():
            old[0].set_exception(Superseded(f"a later acquire of rank {rank} for {g.key!r} replaced this one",
                                            field="key", fix="wait for the later acquire's reply"))
        g.waiters[rank] = (fut, self.clock())
        return fut

    def _fail_waiters(self, g: GroupState, error: Exception) -> None:
        """Wake ``g``'s blocked acquires with ``error``; they no longer ask for it (its holders keep it)."""
        for rank, (fut, _) in list(g.waiters.items()):
            if not fut.done():
                fut.set_exception(error)
            if rank not in g.holders:
                g.intents.discard(rank)
                g.acquirers.discard(rank)
                g.lease_asks.discard(rank)
                if self.intent.get((g.job, rank)) == g.key:
                    del self.intent[(g.job, rank)]
        g.waiters.clear()
        for rank in [r for r in g.intents if r not in g.holders]:  # prepared members too
            g.intents.discard(rank)
            g.acquirers.discard(rank)
            if self.intent.get((g.job, rank)) == g.key:
                del self.intent[(g.job, rank)]
        g.ready_since = 0.0

    def _wake_job(self, job: str, error: Exception) -> None:
        """Every waiter of the job's groups fails with ``error``, and the groups start a fresh round (no
        holders, no lease): the job rebuilds from its checkpoint and acquires again."""
        for g in self.job_groups.get(job, {}).values():
            for fut, _ in g.waiters.values():
                if not fut.done():
                    fut.set_exception(error)
            g.waiters.clear()
            g.intents, g.acquirers, g.holders, g.lease_asks = set(), set(), set(), set()
            g.restored, g.restored_ops, g.rejoins = None, None, {}
            g.lease, g.revoking, g.ops, g.limit, g.ready_since = None, False, {}, {}, 0.0
            if g.status == GroupStatus.GRANTED:
                g.status = GroupStatus.IDLE  # an APPLYING one settles on its own
        for k in [k for k in self.intent if k[0] == job]:
            del self.intent[k]

    def _forget_job(self, job: str) -> None:
        """Drop a job's groups (their waiters cancelled), intents, ports and connections from memory."""
        for g in list(self.job_groups.get(job, {}).values()):
            for fut, _ in g.waiters.values():
                fut.cancel()
            g.waiters.clear()
            g.intents.clear()
            g.acquirers.clear()
            self._unindex(g)
        self.job_groups.pop(job, None)
        for k in [k for k in self.intent if k[0] == job]:
            del self.intent[k]
        for rank, ports in self.jobs.get(job, {}).get("ranks", {}).items():
            self.connected.discard((job, rank))
            self._resync(job, rank, schedule=False)
            for device, port in ports.items():
                if self.owner.get((device, port)) == job:
                    del self.owner[(device, port)]

    def _rewire_plan(self, job: str, moved: dict[str, tuple[int, int]]) -> dict[str, tuple]:
        """Per device, the change that moves the lit circuits of the failed port to the spare's port
        (the idle spare's own circuits go dark; circuits to another job's ports are left alone), if none
        of the ports it switches carries another group's traffic or is still switching (else the
        scheduler lights the rewritten groups when they are acquired)."""
        plan = {}
        now = self.clock()
        for device, (f, s) in moved.items():
            driver = self.devices[device]
            state = driver.state()
            target = {}
            for i, o in state.items():
                if s in (i, o):
                    continue
                if f in (i, o) and self.owner.get((device, o if i == f else i), job) != job:
                    continue
                i2, o2 = (s if i == f else i), (s if o == f else o)
                if i2 != o2:
                    target[i2] = o2
            changes = {i: target.get(i) for i in state.keys() | target.keys() if state.get(i) != target.get(i)}
            if not changes:
                continue
            after = driver.validate(changes)
            ins, outs = changed_ports(state, after)
            busy = self._used(device, ins, outs, lambda h: h.active() and (h.job != job or
                                                                              h.status == GroupStatus.APPLYING))
            if any(busy) or self._switching_until(device, ins | outs) > now + _EPS:
                continue
            plan[device] = (changes, after, ins, outs)
        return plan

    # -- indexes ----------------------------------------------------------------------------------------
    def _index(self, g: GroupState) -> None:
        if not g.order:
            g.order = next(self._order)
        self.groups[(g.job, g.key)] = g
        self.job_groups.setdefault(g.job, {})[g.key] = g
        for k in g.port_keys():
            self.port_groups.setdefault(k, set()).add(g)

    def _unindex(self, g: GroupState) -> None:
        if self.groups.get((g.job, g.key)) is g:
            del self.groups[(g.job, g.key)]
        if self.job_groups.get(g.job, {}).get(g.key) is g:
            del self.job_groups[g.job][g.key]
        for k in g.port_keys():
            users = self.port_groups.get(k)
            if users is not None:
                users.discard(g)
                if not users:
                    del self.port_groups[k]
        self._ready.discard(g)

    # -- lookups and views ------------------------------------------------------------------------------
    def _device(self, device: str, *, field: str):
        if device not in self.devices:
            raise ScenarioError(f"unknown device {device!r}", field=field,
                                fix=f"devices: {', '.join(sorted(self.devices))}")
        return self.devices[device]

    def _check_port(self, device: str, port: int, *, field: str) -> None:
        ports = self._device(device, field=field).ports
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < ports:
            raise ScenarioError(f"port {port!r} is not a port of {device}", field=field, fix=f"use 0..{ports - 1}")

    def _check_alive(self, g: GroupState) -> None:
        if self.dead:
            dead = g.port_keys() & self.dead
            if dead:
                raise self._dead_error(*min(dead))

    @staticmethod
    def _dead_error(device: str, port: int) -> InfeasibleError:
        return InfeasibleError(f"port {port} on {device} is dead (failed)", field=f"circuits.{device}",
                               fix="re-plan without it")

    def _job(self, job: str) -> dict:
        if job not in self.jobs:
            raise ScenarioError(f"unknown job {job!r}", field="job", fix="send hello first")
        return self.jobs[job]

    def _group(self, job: str, key: str, rank: int) -> GroupState:
        g = self.groups.get((job, key))
        if g is None:
            raise ScenarioError(f"unknown group {key!r} of job {job!r}", field="key", fix="declare it with op=group")
        if rank not in g.members:
            raise ScenarioError(f"rank {rank} is not a member of group {key!r}", field="rank")
        return g

    def state(self) -> dict:
        return {"devices": {name: {"driver": type(d).__name__, "ports": d.ports, "duplex": d.duplex,
                                   "delay_s": d.delay_s, "circuits": {str(i): o for i, o in sorted(d.state().items())}}
                            for name, d in self.devices.items()},
                "owners": {name: {str(p): j for (d, p), j in sorted(self.owner.items()) if d == name}
                           for name in self.devices}}

    def ports_view(self) -> dict:
        """Per device, the dead ports and the ports still switching (seconds left)."""
        now = self.clock()
        return {name: {"dead": sorted(p for d, p in self.dead if d == name),
                       "switching": {str(p): round(t - now, 6) for (d, p), t in sorted(self.switching.items())
                                     if d == name and t > now + _EPS}}
                for name in self.devices}

    def jobs_view(self) -> dict:
        return {job: {"world": info["world"], "spares": info.get("spares", 0), "epoch": info.get("epoch", 0),
                      "registered": sorted(info["ranks"]),
                      "connected": sorted(r for r in info["ranks"] if (job, r) in self.connected),
                      "groups": {g.key: {"phase": g.phase, "status": g.status.value, "members": sorted(g.members),
                                         "holders": sorted(g.holders), "waiting": sorted(g.waiters),
                                         "lease": g.lease, "revoking": g.revoking}
                                 for g in self.job_groups.get(job, {}).values()}}
                for job, info in self.jobs.items()}
