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

The controller is driven by its server (``server.py``) but does no I/O besides its Store and
the drivers; the clock and sleep are injected so tests can run it in virtual time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.protocol import Ack, Acquire, Bye, Group, Hello, Release
from lightrail.runtime.controller.store import Store
from lightrail.runtime.ocs import changed_ports, make_driver

__all__ = ["Controller", "GroupState", "GroupStatus"]


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
    ops: dict[int, int] = field(default_factory=dict)  # revoking: ops each member that acked ran under the lease
    limit: dict[int, int] = field(default_factory=dict)  # revoking: ops a holder still inside may reach

    def ports(self) -> dict[str, tuple[set[int], set[int]]]:
        """Per device, the inputs and the outputs its circuits use."""
        return {d: (set(c), set(c.values())) for d, c in self.circuits.items()}

    def active(self) -> bool:
        """Its ports carry traffic: a change under way, holders, or a lease not yet over."""
        return self.status == GroupStatus.APPLYING or (
            self.status == GroupStatus.GRANTED and (bool(self.holders) or self.lease is not None))

    def started(self) -> int:
        """Revoking: the most ops any member ran or is allowed to run under the lease."""
        return max([*self.ops.values(), *self.limit.values(), 0])


class Controller:
    """Authoritative circuit state of every OCS and port ownership of every job (see module doc)."""

    def __init__(self, config: ControllerConfig, store: Store, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable] = asyncio.sleep, log: Callable[..., None] = lambda *a, **k: None,
                 notify: Callable[[str, int, dict], None] = lambda job, rank, message: None):
        self.config = config
        self.notify = notify  # (job, rank, message): push a message to the rank (the server writes it)
        self.store = store
        self.clock, self.sleep, self.log = clock, sleep, log
        self.devices = {d.name: make_driver(d.driver, name=d.name, ports=d.ports, delay_s=d.delay, duplex=d.duplex)
                        for d in config.devices}
        for device, state in store.circuits().items():
            if device in self.devices:
                self.devices[device].restore(state)
        self.jobs = store.jobs()
        self.owner = {(d, p): job for job, info in self.jobs.items()
                      for ports in info["ranks"].values() for d, p in ports.items()}
        self.groups: dict[tuple[str, str], GroupState] = {}
        self.intent: dict[tuple[str, int], str] = {}
        self.latencies: deque[float] = deque(maxlen=100_000)  # acquire -> grant, seconds
        self.counters: dict[str, float] = {"requests": 0, "errors": 0, "grants": 0, "grants_without_change": 0,
                                           "leases": 0, "revocations": 0, "rejoins": 0, "unsafe_reconfigurations": 0}
        self._lease_ids = itertools.count(1)
        self.applies: deque[dict] = deque(maxlen=1000)  # recent reconfigurations, for the admin API and tests
        self._tasks: set[asyncio.Task] = set()

    # -- requests ---------------------------------------------------------------------------------------
    def hello(self, m: Hello) -> dict:
        job = self.jobs.get(m.job)
        if job is not None and job["world"] != m.world:
            raise ScenarioError(f"job {m.job!r} has world {job['world']}, not {m.world}", field="world",
                                fix="every rank of a job must give the same world size")
        if m.rank >= m.world:
            raise ScenarioError(f"rank {m.rank} is outside world {m.world}", field="rank", fix=f"use 0..{m.world - 1}")
        for device, port in m.ports.items():
            self._check_port(device, port, field=f"ports.{device}")
            owner = self.owner.get((device, port))
            mine = job is not None and job["ranks"].get(m.rank, {}).get(device) == port
            if owner is not None and not mine:
                raise InfeasibleError(f"port {port} on {device} is already owned by job {owner!r}",
                                      field=f"ports.{device}", fix="each NIC port belongs to one rank of one job")
        self.store.add_rank(m.job, m.world, m.rank, m.ports)
        job = self.jobs.setdefault(m.job, {"world": m.world, "ranks": {}})
        for device, port in job["ranks"].get(m.rank, {}).items():
            self.owner.pop((device, port), None)
        job["ranks"][m.rank] = dict(m.ports)
        self.owner.update({(d, p): m.job for d, p in m.ports.items()})
        self.log("hello", job=m.job, rank=m.rank, ports=m.ports)
        return {"registered": len(job["ranks"]), "world": m.world}

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
            if (old.members, old.circuits) != (new.members, new.circuits):
                raise ScenarioError(f"group {m.key!r} is already declared with other members or circuits",
                                    field="key", fix="use a new key for a different communicator")
            return {"key": m.key}
        self.groups[key] = new
        return {"key": m.key}

    def acquire(self, m: Acquire) -> asyncio.Future | None:
        """Ask for a group; returns a future resolved on grant (with None for a per-op grant, else the
        reply's lease fields), or None for a prepare (and for a repeated acquire by a rank that
        already holds the group)."""
        g = self._group(m.job, m.key, m.rank)
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
        if g.lease is not None and m.op == "acquire" and m.rank in g.ops and g.started() > g.ops[m.rank]:
            fut = asyncio.get_running_loop().create_future()  # behind the others: run the rest first
            g.waiters[m.rank] = (fut, self.clock())
            self._rejoin(g, m.rank)
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
            fut = asyncio.get_running_loop().create_future()
            g.waiters[m.rank] = (fut, self.clock())
        # Only a completed barrier or freed ports can make anything new possible. A rank back while
        # the group is still granted waits for the next round (the last release reschedules).
        if complete or freed:
            self._schedule()
        return fut

    def release(self, m: Release) -> dict:
        g = self._group(m.job, m.key, m.rank)
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

    def lease_of(self, job: str, key: str, rank: int) -> int | None:
        """The lease ``rank`` holds on the group, if its round is a lease."""
        g = self.groups.get((job, key))
        return g.lease if g is not None and rank in g.holders else None

    def bye(self, m: Bye) -> dict:
        job = self._job(m.job)
        if m.rank is not None:
            if m.rank not in job["ranks"]:
                raise ScenarioError(f"rank {m.rank} of job {m.job!r} is not registered", field="rank")
            self.disconnect(m.job, m.rank)
            self.store.remove_rank(m.job, m.rank)
            for device, port in job["ranks"].pop(m.rank).items():
                self.owner.pop((device, port), None)
            if job["ranks"]:
                return {"remaining": len(job["ranks"])}
        for key in [k for k in self.groups if k[0] == m.job]:
            for fut, _ in self.groups[key].waiters.values():
                fut.cancel()
            del self.groups[key]
        for k in [k for k in self.intent if k[0] == m.job]:
            del self.intent[k]
        self.store.remove_job(m.job)
        del self.jobs[m.job]
        self.owner = {k: j for k, j in self.owner.items() if j != m.job}
        self._schedule()
        return {"remaining": 0}

    def disconnect(self, job: str, rank: int) -> None:
        """A rank's connection closed: it no longer holds or waits for anything (its leases vanish)."""
        key = self.intent.get((job, rank))
        freed = key is not None and self._leave(job, rank, key)
        for g in [g for g in self.groups.values() if g.job == job and g.lease is not None]:
            if rank in g.holders or rank in g.ops:
                g.holders.discard(rank)
                g.ops.pop(rank, None)
                g.limit.pop(rank, None)
                freed = self._lease_progress(g) or freed
        if freed:
            self._schedule()

    def configure(self, device: str, changes: dict[int, int | None], *, job: str | None = None) -> dict:
        """Admin change of one device's circuits (validated; nothing changes on error)."""
        driver = self._device(device, field="device")
        for port in set(changes) | {o for o in changes.values() if o is not None}:
            self._check_port(device, port, field=f"changes.{port}")
        ins, outs = changed_ports(driver.state(), driver.validate(changes))
        for port in sorted(ins | outs):  # every port the change switches, not only the ones it names
            owner = self.owner.get((device, port))
            if owner is not None and owner != job:
                raise InfeasibleError(f"port {port} on {device} is owned by job {owner!r}", field=f"changes.{port}",
                                      fix="only the owning job's ports can be switched (give job=...)")
        hot_in, hot_out = self._hot(device, changes, self._busy())
        if hot_in or hot_out:
            port = min(hot_in | hot_out)
            raise InfeasibleError(f"port {port} on {device} carries traffic", field=f"changes.{port}",
                                  fix="wait until its group is released")
        now = self.clock()
        done = driver.apply(changes, now)
        self.store.set_circuits(device, driver.state())
        return {"device": device, "completes_in_s": done - now, "circuits": driver.state()}

    # -- scheduling -------------------------------------------------------------------------------------
    def _busy(self) -> dict[str, tuple[set[int], set[int]]]:
        """Per device, inputs and outputs that carry traffic: those of granted groups with holders, of
        leases not over yet and of groups whose reconfiguration is under way."""
        busy: dict[str, tuple[set[int], set[int]]] = {}
        for g in self.groups.values():
            if g.active():
                _add_ports(busy, g)
        return busy

    def _hot(self, device: str, changes: dict[int, int | None], busy) -> tuple[set[int], set[int]]:
        """Inputs and outputs that ``changes`` would switch while they carry traffic."""
        driver = self.devices[device]
        ins, outs = changed_ports(driver.state(), driver.validate(changes))
        b_in, b_out = busy.get(device, (set(), set()))
        return ins & b_in, outs & b_out

    def _changes(self, g: GroupState) -> dict[str, dict[int, int | None]]:
        """Per device, the change set that lights ``g``'s circuits (darkening inputs on its outputs)."""
        out = {}
        for device, circuits in g.circuits.items():
            driver = self.devices[device]
            state = driver.state()
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

    def _provisioned(self) -> dict[str, tuple[set[int], set[int]]]:
        """Ports of groups lit for members that all asked but have not all acquired yet (prepared):
        only a group whose members all acquired may take them, so two prepared groups never
        switch the fabric back and forth."""
        soft: dict[str, tuple[set[int], set[int]]] = {}
        for g in self.groups.values():
            if g.status == GroupStatus.IDLE and len(g.intents) == len(g.members) and len(g.acquirers) < len(g.members) \
                    and not self._changes(g):
                _add_ports(soft, g)
        return soft

    def _schedule(self) -> None:
        """Light every group whose members all asked and whose change switches no busy port (the
        switch changes at once, the group is granted after the delay); grant the lit groups whose
        members all acquired."""
        ready = sorted((g for g in self.groups.values() if g.status == GroupStatus.IDLE and g.intents
                        and len(g.intents) == len(g.members)), key=lambda g: g.ready_since)
        if not ready:
            return
        busy, soft = self._busy(), None
        for g in ready:
            changes = self._changes(g)
            acquired = len(g.acquirers) == len(g.members)
            if not changes:
                if acquired:
                    self.counters["grants_without_change"] += 1
                    self._grant(g)
                    _add_ports(busy, g)
                continue  # lit; its prepared members will acquire it
            blocked = busy
            if not acquired:
                soft = self._provisioned() if soft is None else soft
                blocked = _merge(busy, soft)
            if any(any(self._hot(d, c, blocked)) for d, c in changes.items()):
                if not acquired and any(any(self._hot(d, c, soft)) for d, c in changes.items()):
                    continue  # lit for another prepared group: wait (no thrash)
                self._revoke_for(g, changes)
                continue  # a port it switches carries traffic: wait (for the release, or the revoked leases)
            self._switch(g, changes)
            _add_ports(busy, g)

    def _revoke_for(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Revoke the leases that keep ``g`` waiting, if nothing else does (a per-op round in use or a
        change under way is waited for; its leases are revoked once it is over)."""
        switched = {d: changed_ports(self.devices[d].state(), self.devices[d].validate(c)) for d, c in changes.items()}
        leases = []
        for h in self.groups.values():
            if h is g or not h.active():
                continue
            ports = h.ports()
            if any(ins & ports[d][0] or outs & ports[d][1] for d, (ins, outs) in switched.items() if d in ports):
                if h.status != GroupStatus.GRANTED or h.lease is None:
                    return
                leases.append(h)
        for h in leases:
            if not h.revoking:
                h.revoking = True
                self.counters["revocations"] += 1
                self.log("revoke", job=h.job, group=h.key, lease=h.lease, holders=sorted(h.holders), wanted_by=g.key)
                for rank in sorted(h.holders):
                    self.notify(h.job, rank, {"op": "revoke", "job": h.job, "rank": rank, "key": h.key,
                                              "lease": h.lease})

    def _switch(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Change the switches now (so every later decision sees the new state); grant after the delay."""
        now = self.clock()
        done = now
        check = self._busy()  # recomputed independently of _schedule's view
        for device, c in changes.items():
            driver = self.devices[device]
            if any(self._hot(device, c, check)):  # never happens: _schedule checked it
                self.counters["unsafe_reconfigurations"] += 1
            ins, outs = changed_ports(driver.state(), driver.validate(c))
            done = max(done, driver.apply(c, now))
            self.store.set_circuits(device, driver.state())
            self.store.add(f"reconfigurations:{device}")
            self.store.add(f"circuit_changes:{device}", len(c))
            b_in, b_out = check.get(device, (set(), set()))
            self.applies.append({"device": device, "group": g.key, "job": g.job, "phase": g.phase, "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": sorted(b_in), "busy_outputs": sorted(b_out)})
        self.store.add("reconfiguration_seconds", done - now)
        self.log("reconfigure", job=g.job, group=g.key, phase=g.phase, devices=sorted(changes), delay_s=done - now)
        g.status = GroupStatus.APPLYING
        task = asyncio.get_running_loop().create_task(self._settle(g, done - now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, g: GroupState, delay: float) -> None:
        if delay > 0:
            await self.sleep(delay)
        g.status = GroupStatus.IDLE
        if len(g.acquirers) == len(g.members) and not self._changes(g):
            self._grant(g)  # every member is waiting for it
        self._schedule()

    def _grant(self, g: GroupState) -> None:
        g.status = GroupStatus.GRANTED
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
        for rank in g.holders:
            fut, asked = g.waiters.pop(rank)
            if not fut.done():
                fut.set_result(reply)
                self.latencies.append(now - asked)
        self.counters["grants"] += 1

    def _rejoin(self, g: GroupState, rank: int) -> None:
        """A member behind the others in a revoked lease runs its remaining ops at once, up to ``until``
        (the ports stay busy; the members ahead of it are waiting for, or have sent, those ops)."""
        fut, asked = g.waiters.pop(rank)
        g.intents.discard(rank)
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        if len(g.intents) < len(g.members):
            g.ready_since = 0.0
        if self.intent.get((g.job, rank)) == g.key:
            del self.intent[(g.job, rank)]
        until = g.started()
        g.holders.add(rank)
        g.limit[rank] = until
        self.counters["rejoins"] += 1
        self.latencies.append(self.clock() - asked)
        if not fut.done():
            fut.set_result({"lease": g.lease, "ops": g.ops.pop(rank), "until": until})

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
        g.status, g.lease, g.revoking, g.ops, g.limit = GroupStatus.IDLE, None, False, {}, {}
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
        if g.status == GroupStatus.GRANTED and not g.holders and g.lease is None:
            g.status = GroupStatus.IDLE  # the round is over; ranks already back wait for the next barrier
            if len(g.intents) == len(g.members):
                g.ready_since = self.clock()
            return True
        return g.status == GroupStatus.IDLE and was_complete  # its lit-for-prepare ports are no longer reserved

    # -- lookups and views ------------------------------------------------------------------------------
    def _device(self, device: str, *, field: str):
        if device not in self.devices:
            raise ScenarioError(f"unknown device {device!r}", field=field,
                                fix=f"devices: {', '.join(sorted(self.devices))}")
        return self.devices[device]

    def _check_port(self, device: str, port: int, *, field: str) -> None:
        ports = self._device(device, field=field).ports
        if not isinstance(port, int) or not 0 <= port < ports:
            raise ScenarioError(f"port {port!r} is not a port of {device}", field=field, fix=f"use 0..{ports - 1}")

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

    def jobs_view(self) -> dict:
        return {job: {"world": info["world"], "registered": sorted(info["ranks"]),
                      "groups": {g.key: {"phase": g.phase, "status": g.status.value, "members": sorted(g.members),
                                         "holders": sorted(g.holders), "waiting": sorted(g.waiters),
                                         "lease": g.lease, "revoking": g.revoking}
                                 for g in self.groups.values() if g.job == job}}
                for job, info in self.jobs.items()}


def _add_ports(busy: dict[str, tuple[set[int], set[int]]], g: GroupState) -> None:
    for d, (ins, outs) in g.ports().items():
        b = busy.setdefault(d, (set(), set()))
        b[0].update(ins)
        b[1].update(outs)


def _merge(a: dict[str, tuple[set[int], set[int]]], b: dict[str, tuple[set[int], set[int]]]):
    return {d: (a.get(d, (set(), set()))[0] | b.get(d, (set(), set()))[0],
                a.get(d, (set(), set()))[1] | b.get(d, (set(), set()))[1]) for d in set(a) | set(b)}
