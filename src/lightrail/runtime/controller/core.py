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

Grant timing (``grant_latency``, ``grant_overhead``, ``switch_lag``, ``revoke_rtt``: :class:`Timings`, in the
injected clock): per group grant, the time from *ready* (the last member's acquire of the round) to the grant, by
what it needed: ``switch`` if a switch for it completed after ready, else ``revoke`` if a lease on ports it switches
had to end after ready, else ``lit``. For a switch, ``grant_overhead`` is that latency minus the switch delay that fell
after ready; ``switch_lag`` splits it: ``before``, ready to the switch's start (0 when a prepare started it earlier),
``after``, the switch's end to the grant. A switch or revoke over before the last member arrived counts as ``lit``.
A revoke's round trip runs from its push to the end of the lease (last ack or release in). Skip-if-present grants a
lit group even while a lease holds its circuits, so ``revoke`` has samples only when another group's switch lit the
circuits after the lease ended.

Storage: every durable change is written to the Store first; a failed write (another process holding
the lock past its bound) raises :class:`~lightrail.errors.InfeasibleError` naming ``state`` and leaves
memory, switches and disk as they were.

Driven by the rank server (``ranks.py``), no I/O but its Store and drivers; clock and sleep are injected (virtual
time in tests). Rooms: group state ``groups.py``, switching and grants ``switching.py``, failures ``failover.py``.
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

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.failover import FailoverLogic
from lightrail.runtime.controller.groups import (
    _EPS,
    Failover,
    GroupState,
    GroupStatus,
    RankFailed,
    Superseded,
    Timings,
    Waiter,
    _running_loop,
)
from lightrail.runtime.controller.protocol import Ack, Acquire, Bye, Group, Hello, Hold, Release, Yield
from lightrail.runtime.controller.store import Store
from lightrail.runtime.controller.switching import Switching
from lightrail.runtime.ocs import make_driver

__all__ = ["Controller", "Failover", "GroupState", "GroupStatus", "RankFailed", "Superseded", "Timings"]


PERSISTED = ("grants", "unsafe_reconfigurations", "failovers")
"""Counters kept in the state file, so they sum over the controller's restarts (issue 31 item 7)."""


RESYNC_GRACE_S = 30.0  # after a restart: the client's reconnect bound (reconnect_timeout, docs/controller.md)


def _digest(token: object) -> str:
    return hashlib.sha256(token.encode() if isinstance(token, str) else b"").hexdigest()


class Controller(Switching, FailoverLogic):
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
        # restored rank are not switched until it resumes (its first acquire, prepare, release, ack or heartbeat,
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
        self.switch_lag: dict[str, Timings] = {"before": Timings(), "after": Timings()}
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
        self._back_in_lease(g, m.rank, op_no if m.op == "acquire" else None)
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
            g.lease_op[m.rank] = op_no
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
            if m.rank in g.held:  # its held op (see GroupState.held) completed; its next op asks again
                del g.held[m.rank]
                g.gone.add(m.rank)
            elif m.rank not in g.limit:
                raise ScenarioError(f"rank {m.rank} holds lease {g.lease} of {m.key!r}: it ends with ack, after a "
                                    f"revoke", field="key", fix="keep the lease until the controller revokes it")
            else:
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
        else:  # back inside an op of this controller's lease (GroupState.held)
            g.held[rank] = op_no
        self.log("hold", job=job, rank=rank, group=key)
        for r in sorted(g.rejoins):  # rejoining acquires that arrived before this hold join the round now
            if r in g.waiters and self._may_join(g, r, g.rejoins[r]):
                self._join(g, r)
        if freed:
            self._schedule()
        return {"key": key, "holders": sorted(g.holders)}

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

    def flush_counters(self) -> None:
        """Write what the persisted counters (:data:`PERSISTED`) gained since the last flush (the server calls this
        every sweep and when it stops; a grant is not worth a write of its own)."""
        gained = {k: self.counters[k] - self._flushed[k] for k in PERSISTED if self.counters[k] != self._flushed[k]}
        if gained:
            self.store.add_counters(gained)
            self._flushed.update({k: self.counters[k] for k in gained})

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
