"""Shared by the controller suites: a controller in virtual time and one-line requests to it, the
random programs and invariant checks of the safety and liveness harnesses.

pytest runs with ``--import-mode=importlib``, so test modules cannot import each other (or this
file): every helper here reaches a test as a fixture of the same name (``make``, ``hello``,
``declare``, ``acquire``, ``release``, ``job_of``, ``lit``, ``record_is_safe``, ``snapshot``,
``lease_pair``, ``lease_a``, ``Harness``, ``LeaseHarness``, ``scripted``, ``until``), and ``spawn`` starts a real
controller process.
"""

from __future__ import annotations

import asyncio
import heapq
import importlib.util
import itertools
import json
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lightrail.runtime.controller.config import ControllerConfig, DeviceConfig, default_config
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.frontend import c_compiler
from lightrail.runtime.controller.protocol import Ack, Acquire, Group, Hello, Release
from lightrail.runtime.controller.store import Store
from lightrail.runtime.ocs import changed_ports

# --- virtual time and one-line requests -------------------------------------------------------------------------------


class VirtualTime:
    """Injected clock and sleep: a sleep is a timer the test fires (``fire``) or drains (``settle``)."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self.timers: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    def sleep(self, dt: float) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self.timers, (self.now + dt, next(self._seq), fut))
        return fut

    def fire(self) -> bool:
        """Advance to the earliest timer and wake its sleeper; False if none is pending."""
        if not self.timers:
            return False
        wake, _, fut = heapq.heappop(self.timers)
        self.now = max(self.now, wake)
        if not fut.done():
            fut.set_result(None)
        return True

    async def settle(self, check=lambda: None, max_steps: int = 500) -> None:
        """Run the loop and fire timers until nothing is pending (``check`` runs after every step);
        fails if the controller keeps sleeping (reconfiguring) with no request coming in."""
        me = asyncio.current_task()
        for _ in range(max_steps):
            for _ in range(4):
                await asyncio.sleep(0)
                check()
            if self.fire():
                continue
            if not [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
                return
        raise AssertionError(f"the controller did not settle: it still reconfigures after {max_steps} steps "
                             f"with no new request")


def make(config: ControllerConfig | None = None, store: Store | None = None) -> tuple[Controller, VirtualTime]:
    vt = VirtualTime()
    config = config or default_config(rails=2, ports=8, delay=0.010)
    return Controller(config, store or Store(":memory:"), clock=vt.clock, sleep=vt.sleep), vt


def hello(c: Controller, job: str, rank: int, world: int, **ports: int) -> dict:
    return c.hello(Hello(op="hello", job=job, rank=rank, world=world, ports=ports))


def declare(c: Controller, job: str, key: str, members, circuits, phase: str = "other") -> dict:
    return c.declare(Group(op="group", job=job, key=key, phase=phase, members=list(members), circuits=circuits))


def acquire(c: Controller, job: str, rank: int, key: str, op: str = "acquire", lease: bool = False):
    return c.acquire(Acquire(op=op, job=job, rank=rank, key=key, lease=lease))


def release(c: Controller, job: str, rank: int, key: str) -> dict:
    return c.release(Release(op="release", job=job, rank=rank, key=key))


def job_of(c: Controller, world: int = 4, job: str = "j") -> None:
    """``world`` ranks of ``job``, rank r on port r of rail0 and rail1."""
    for r in range(world):
        hello(c, job, r, world, rail0=r, rail1=r)


def lit(c: Controller, circuits: dict[str, dict[int, int]]) -> bool:
    return all(c.devices[d].state().get(i) == o for d, cs in circuits.items() for i, o in cs.items())


def conflicting(a: dict[int, int], b: dict[int, int]) -> bool:
    """Two circuit sets that cannot be lit together: one input to two outputs, or two inputs to one output."""
    fed_a, fed_b = {o: i for i, o in a.items()}, {o: i for i, o in b.items()}
    return any(b.get(i, o) != o for i, o in a.items()) or any(fed_b.get(o, i) != i for o, i in fed_a.items())


def record_is_safe(rec: dict) -> bool:
    """A /reconfigurations record switched no input and no output that carried traffic."""
    return not (set(rec["changed_inputs"]) & set(rec["busy_inputs"])
                or set(rec["changed_outputs"]) & set(rec["busy_outputs"]))


def snapshot(c: Controller):
    return (json.dumps(c.state(), sort_keys=True), json.dumps(c.jobs_view(), sort_keys=True),
            {k: (g.members, json.dumps(g.circuits, sort_keys=True)) for k, g in c.groups.items()},
            {d: drv.reconfigurations for d, drv in c.devices.items()})


# --- a lease between two groups ---------------------------------------------------------------------------------------


def lease_pair() -> tuple[Controller, VirtualTime, list]:
    """A controller in virtual time with group A = ranks 0, 1 on rail0 ports 0 <-> 1 and B = ranks 0, 2 on
    ports 0 <-> 2 (conflicts with A); returns it, its clock and the list of messages it pushes."""
    c, vt = make()
    pushed: list = []
    c.notify = lambda job, rank, message: pushed.append((rank, message))
    job_of(c)
    declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}}, phase="dp")
    declare(c, "j", "B", [0, 2], {"rail0": {0: 2, 2: 0}}, phase="pp")
    return c, vt, pushed


async def lease_a(c: Controller, vt: VirtualTime) -> None:
    """Ranks 0 and 1 take group A on a lease."""
    for r in (0, 1):
        acquire(c, "j", r, "A", lease=True)
    await vt.settle()


# --- random programs, checked at every switch change and grant --------------------------------------------------------


SAFETY_CONFIG = ControllerConfig(devices=[DeviceConfig(name="r0", ports=8, delay=0.010),
                                          DeviceConfig(name="r1", ports=8, delay=0.025, duplex=True)])


JOBS = {"j": [0, 1, 2, 3, 4, 5], "k": [6, 7]}  # job -> the port (on both devices) of each rank


def _random_group(rng: random.Random, ports: list[int]) -> tuple[list[int], dict[str, dict[int, int]]]:
    """Members (ranks) and circuits on their ports (sometimes other ports of the job)."""
    world = len(ports)
    size = rng.randint(2, min(4, world))
    members = sorted(rng.sample(range(world), size))
    circuits: dict[str, dict[int, int]] = {}
    while not circuits:
        for device in ("r0", "r1"):
            if rng.random() < 0.35:
                continue
            pool = [ports[m] for m in members]
            if rng.random() < 0.3:
                pool = sorted(set(pool) | {rng.choice(ports)})
            if device == "r0":  # a random partial permutation without loopbacks
                outs = pool[:]
                rng.shuffle(outs)
                c = {i: o for i, o in zip(pool, outs, strict=True) if i != o and rng.random() < 0.8}
            else:  # duplex: a random matching, both directions
                p = pool[:]
                rng.shuffle(p)
                c = {}
                for a, b in zip(p[::2], p[1::2], strict=False):
                    c.update({a: b, b: a})
            if c:
                circuits[device] = c
    return members, circuits


def watch(c: Controller, violations: list[str], busy) -> None:
    """Check at the moment of every switch change that no port of a group ``busy(g)`` names (a reason, or
    None) is switched, and at every grant that every member acquired and the circuits are lit."""
    for name, driver in c.devices.items():
        def apply(changes, now, _orig=driver.apply, _driver=driver, _name=name):
            ins, outs = changed_ports(_driver.state(), _driver.validate(changes))
            for g in c.groups.values():
                circuits = g.circuits.get(_name, {})
                hot = (ins & set(circuits)) | {f"out{o}" for o in outs & set(circuits.values())}
                reason = busy(g) if hot else None
                if reason:
                    violations.append(f"{_name}: {sorted(map(str, hot))} switched while {g.job}/{g.key} {reason}")
            return _orig(changes, now)
        driver.apply = apply
    orig_grant = c._grant

    def grant(g):
        if len(g.acquirers) != len(g.members):
            violations.append(f"{g.key} granted before every member acquired: {sorted(g.acquirers)}")
        if not lit(c, g.circuits):
            violations.append(f"{g.key} granted before its circuits are lit")
        orig_grant(g)
    c._grant = grant


async def drive(h, steps: int, *, stop_early: bool) -> None:
    """Random interleavings of ``h``'s ranks (timers fired and the loop yielded at random when bursty),
    checked after every step; then liveness: every rank finishes its program, or the run fails saying
    where it is stuck. ``stop_early``: end the random phase once every program counter is at its end."""
    ranks = list(h.phase)
    for _ in range(steps):
        if stop_early and all(h.pc[r] >= len(h.programs[r]) for r in ranks):
            break
        roll = h.rng.random()
        if h.bursty and roll < 0.2:
            h.vt.fire()
        elif h.bursty and roll < 0.4:
            await asyncio.sleep(0)
        else:
            h.step(h.rng.choice(ranks))
        h.check()
        if not h.bursty:
            await h.vt.settle(h.check)
    for _ in range(10_000):  # blocked acquires are granted once holders release
        await h.vt.settle(h.check)
        if all(h.finished(r) for r in ranks):
            break
        before = h.progress()
        for r in ranks:
            h.step(r, drain=True)
            h.check()
            if not h.bursty:
                await h.vt.settle(h.check)
        await h.vt.settle(h.check)
        if h.progress() == before:
            raise AssertionError(f"seed {h.seed}: no progress; {h.stuck()}")
    else:
        raise AssertionError(f"seed {h.seed}: did not finish")


# --- per-op groups under random interleavings -------------------------------------------------------------------------


class Harness:
    """Ranks that run an SPMD program, interleaved at random, with the safety invariants checked after
    every step. Each job has a global sequence of collectives (groups); each rank walks, in that order,
    the ones it belongs to: acquire (or prepare, then acquire), hold, release. Like a real collective,
    an instance completes only when every member has joined it, so a rank leaves an instance only after
    all its members held it (otherwise a fast rank could run the same group twice alone)."""

    def __init__(self, seed: int, *, bursty: bool, reuse_when_left: bool = True, prepare: float = 0.0):
        self.rng = random.Random(seed)
        self.seed, self.bursty, self.reuse_when_left, self.prepare = seed, bursty, reuse_when_left, prepare
        self.c, self.vt = make(SAFETY_CONFIG)
        self.violations: list[str] = []
        self.members: dict[tuple[str, str], list[int]] = {}
        self.programs: dict[tuple[str, int], list[tuple[int, str]]] = {}  # (instance, group key)
        self.joined: dict[tuple[str, int], set[int]] = {}  # (job, instance) -> ranks that held it
        self.left: dict[tuple[str, int], set[int]] = {}  # (job, instance) -> ranks that released it
        self.previous: dict[tuple[str, int], int] = {}  # (job, instance) -> previous instance of its group
        self.pc: dict[tuple[str, int], int] = {}
        self.phase: dict[tuple[str, int], str] = {}  # idle / prepared / waiting / holding
        self.futures: dict[tuple[str, int], asyncio.Future] = {}
        for job, ports in JOBS.items():
            for r, p in enumerate(ports):
                hello(self.c, job, r, len(ports), r0=p, r1=p)
            keys = []
            for n in range(self.rng.randint(3, 6) if len(ports) > 2 else 2):
                members, circuits = _random_group(self.rng, ports)
                declare(self.c, job, f"g{n}", members, circuits)
                self.members[(job, f"g{n}")] = members
                keys.append(f"g{n}")
            sequence = [self.rng.choice(keys) for _ in range(self.rng.randint(10, 25))]
            last: dict[str, int] = {}
            for n, k in enumerate(sequence):
                if k in last:
                    self.previous[(job, n)] = last[k]
                last[k] = n
            for r in range(len(ports)):
                self.programs[(job, r)] = [(n, k) for n, k in enumerate(sequence) if r in self.members[(job, k)]]
                self.pc[(job, r)] = 0
                self.phase[(job, r)] = "idle"
        self._wrap()

    def finished(self, r) -> bool:
        return self.phase[r] == "idle" and self.pc[r] >= len(self.programs[r])

    def progress(self):
        return dict(self.phase), dict(self.pc)

    def stuck(self) -> str:
        groups = {f"{g.job}/{g.key}": (g.status, sorted(g.intents), sorted(g.holders))
                  for g in self.c.groups.values() if g.intents}
        return f"groups {groups}"

    def _wrap(self) -> None:
        """Check at the moment of every switch change and every grant (not only after the fact)."""
        def busy(g):
            return f"is held by {sorted(g.holders)}" if g.status == "granted" and g.holders else None
        watch(self.c, self.violations, busy)

    def _hold(self, rank: tuple[str, int]) -> None:
        self.phase[rank] = "holding"
        self.joined.setdefault((rank[0], self.programs[rank][self.pc[rank]][0]), set()).add(rank[1])

    def check(self) -> None:
        c = self.c
        for rank, fut in self.futures.items():
            if fut.done() and self.phase[rank] == "waiting":
                assert not fut.cancelled(), f"seed {self.seed}: {rank}: acquire cancelled"
                self._hold(rank)
        held = [g for g in c.groups.values() if g.status == "granted" and g.holders]
        for g in held:
            if not lit(c, g.circuits):
                self.violations.append(f"{g.job}/{g.key} held by {sorted(g.holders)} but its circuits "
                                       f"{g.circuits} are not lit: {({d: c.devices[d].state() for d in g.circuits})}")
        for a, b in itertools.combinations(held, 2):
            for d in a.circuits.keys() & b.circuits.keys():
                if conflicting(a.circuits[d], b.circuits[d]):
                    self.violations.append(f"{a.key} and {b.key} both held with conflicting circuits on {d}: "
                                           f"{a.circuits[d]} vs {b.circuits[d]}")
        for (job, r), phase in self.phase.items():
            if phase == "holding":
                key = self.programs[(job, r)][self.pc[(job, r)]][1]
                g = c.groups[(job, key)]
                if g.status != "granted" or r not in g.holders:
                    self.violations.append(f"{job}/{r} holds {key} but the controller says {g.status} "
                                           f"{sorted(g.holders)}")
        if c.counters["unsafe_reconfigurations"]:
            self.violations.append("unsafe_reconfigurations > 0")
        for rec in c.applies:
            if not record_is_safe(rec):
                self.violations.append(f"apply record {rec}")
        assert not self.violations, f"seed {self.seed}: {self.violations[0]}"

    def _may_start(self, rank: tuple[str, int], pc: int) -> bool:
        """With ``reuse_when_left``, a rank asks for a group again only once every member left its previous
        instance (a program-level order that avoids the deadlock of test_reacquiring_a_granted_group_...)."""
        job = rank[0]
        instance, key = self.programs[rank][pc]
        prev = self.previous.get((job, instance))
        return (not self.reuse_when_left or prev is None
                or set(self.members[(job, key)]) <= self.left.get((job, prev), set()))

    def _leave(self, rank: tuple[str, int]) -> None:
        self.left.setdefault((rank[0], self.programs[rank][self.pc[rank]][0]), set()).add(rank[1])
        self.pc[rank] += 1

    def _acquire(self, rank: tuple[str, int], op: str = "acquire") -> None:
        key = self.programs[rank][self.pc[rank]][1]
        fut = acquire(self.c, rank[0], rank[1], key, op=op)
        if op == "prepare":
            self.phase[rank] = "prepared"
        elif fut is None:
            self._hold(rank)
        else:
            self.phase[rank], self.futures[rank] = "waiting", fut

    def step(self, rank: tuple[str, int], *, drain: bool = False) -> bool:
        """Advance one rank by one protocol message (two for release + prepare); False if it cannot."""
        phase, pc, program = self.phase[rank], self.pc[rank], self.programs[rank]
        if phase == "waiting" or (phase == "idle" and pc >= len(program)):
            return False
        if phase == "prepared":
            self._acquire(rank)
        elif phase == "idle":
            if not self._may_start(rank, pc):
                return False
            self._acquire(rank, "prepare" if self.rng.random() < self.prepare else "acquire")
        else:  # holding: the collective is done once every member joined this instance
            instance, key = program[pc]
            if not set(self.members[(rank[0], key)]) <= self.joined.get((rank[0], instance), set()):
                return False
            nxt = pc + 1 < len(program)
            roll = 1.0 if drain else self.rng.random()
            self._leave(rank)
            if self.bursty and nxt and roll < 0.25 and program[pc + 1][1] != key and self._may_start(rank, pc + 1):
                self._acquire(rank)  # acquiring the next (other) group leaves this one
            else:
                release(self.c, rank[0], rank[1], key)
                self.phase[rank] = "idle"
                if self.prepare and self.bursty and nxt and roll < 0.5 and self._may_start(rank, pc + 1):
                    self._acquire(rank, "prepare")  # release(then_prepare=): no await in between
        return True

    async def run(self, steps: int = 150) -> None:
        await drive(self, steps, stop_early=False)
        assert all(f.done() and not f.cancelled() for f in self.futures.values())
        assert all(g.status == "idle" and not g.intents and not g.holders and not g.waiters
                   for g in self.c.groups.values())
        assert not self.vt.timers and not self.c._tasks


# --- leased and per-op groups under random interleavings --------------------------------------------------------------


def _compatible(a: dict[str, dict[int, int]], b: dict[str, dict[int, int]]) -> bool:
    return not any(conflicting(a[d], b[d]) for d in a.keys() & b.keys())


class LeaseHarness:
    """Ranks running SPMD programs with leased and per-op groups, interleaved at random, with the safety
    invariants checked at every switch change and after every step.

    A job's program is a sequence of blocks (phases). A leased block uses the groups of one phase,
    whose circuits never conflict (one configuration, as ``Plan.single_configuration``); most of them
    take leases, the others are per-op. A per-op block uses other random groups, which may conflict.
    As in a training program, a rank starts an op of a later block only once every member of that op
    left all its ops of earlier blocks, and runs one under a lease (no barrier) only once every rank
    of the job did: a rank inside a leased op waiting for a peer that waits, through other ranks, for
    a group of an earlier phase that conflicts with the lease would never see the revoke answered.
    (The torch backend gives leases only to phases of one configuration, whose ops every rank
    reaches in program order; see torch_backend.) Some two-member groups are point-to-point: the sender's op
    completes as soon as it joined (its data is in flight until the receiver takes it), so a sender
    runs ahead of its receiver under a lease. Each rank mirrors ControllerClient: an op on a group it
    holds a lease on runs with no message; a revoke (pushed to the rank's inbox, handled at a random
    later step, even while the rank waits for another group) is acked at once, as inside when the
    rank is inside an op on that group (it then releases when the op completes)."""

    def __init__(self, seed: int, *, bursty: bool, prepare: float = 0.0):
        self.rng = random.Random(seed)
        self.seed, self.bursty, self.prepare = seed, bursty, prepare
        self.c, self.vt = make(SAFETY_CONFIG)
        self.c.notify = lambda job, rank, message: self.inbox[(job, rank)].append(message)
        self.violations: list[str] = []
        self.groups: dict[tuple[str, str], dict] = {}  # members, circuits, leased, sender
        self.programs: dict[tuple[str, int], list[tuple[int, int, str]]] = {}  # (instance, block, key)
        self.joined: dict[tuple[str, int], set[int]] = {}
        self.left: dict[tuple[str, int], set[int]] = {}
        self.pc: dict[tuple[str, int], int] = {}
        self.phase: dict[tuple[str, int], str] = {}  # idle / prepared / waiting / holding
        self.futures: dict[tuple[str, int], asyncio.Future] = {}
        self.leases: dict[tuple[str, int], dict[str, dict]] = {}  # the rank's view, as ControllerClient.leases
        self.inbox: dict[tuple[str, int], list[dict]] = {}
        self.under_lease_ops = self.revoked_inside = 0
        for job, ports in JOBS.items():
            for r, p in enumerate(ports):
                hello(self.c, job, r, len(ports), r0=p, r1=p)
            phases: list[list[str]] = []
            n = 0
            for kind in ["lease"] * self.rng.randint(1, 3) + ["per-op"] * self.rng.randint(0, 2):
                keys: list[str] = []
                for _ in range(self.rng.randint(1, 4)):
                    members, circuits = _random_group(self.rng, ports)
                    if kind == "lease" and not all(_compatible(circuits, self.groups[(job, k)]["circuits"])
                                                   for k in keys):
                        continue
                    key = f"g{n}"
                    n += 1
                    declare(self.c, job, key, members, circuits)
                    sender = self.rng.choice(members) if len(members) == 2 and self.rng.random() < 0.7 else None
                    self.groups[(job, key)] = {"members": members, "circuits": circuits, "sender": sender,
                                               "leased": kind == "lease" and self.rng.random() < 0.8}
                    keys.append(key)
                phases.append(keys)
            sequence = []
            for block in range(self.rng.randint(3, 7) if len(ports) > 2 else 3):
                keys = self.rng.choice(phases)
                for _ in range(self.rng.randint(1, 8)):  # often the same group again (several ops per lease)
                    same = sequence and sequence[-1][0] == block and self.rng.random() < 0.5
                    sequence.append((block, sequence[-1][1] if same else self.rng.choice(keys)))
            for r in range(len(ports)):
                rank = (job, r)
                self.programs[rank] = [(i, b, k) for i, (b, k) in enumerate(sequence)
                                       if r in self.groups[(job, k)]["members"]]
                self.pc[rank], self.phase[rank], self.leases[rank], self.inbox[rank] = 0, "idle", {}, []
        self._wrap()

    # -- invariants -------------------------------------------------------------------------------------
    def _in_flight(self) -> set[tuple[str, str]]:
        """Groups with an op under way: a member joined it and not every member left it."""
        out = set()
        for (job, instance), joined in self.joined.items():
            key = next(k for (i, _, k) in self.programs[(job, min(joined))] if i == instance)
            if set(self.groups[(job, key)]["members"]) - self.left.get((job, instance), set()):
                out.add((job, key))
        return out

    def _leased(self) -> set[tuple[str, str]]:
        """Groups some rank holds a lease on that it has not given back (not acked)."""
        return {(rank[0], key) for rank, leases in self.leases.items() for key, lease in leases.items()
                if not lease["revoked"] or lease["in_op"]}

    def finished(self, r) -> bool:
        return self.phase[r] == "idle" and self.pc[r] >= len(self.programs[r]) and not self.inbox[r]

    def progress(self):
        return dict(self.phase), dict(self.pc), sum(map(len, self.inbox.values()))

    def stuck(self) -> str:
        groups = {f"{g.job}/{g.key}": (g.status, g.lease, sorted(g.intents), sorted(g.holders), g.ops)
                  for g in self.c.groups.values() if g.intents or g.holders}
        return f"pcs {self.pc}; groups {groups}"

    def _wrap(self) -> None:
        def busy(g):
            if g.active() and g.status != "applying" or (g.job, g.key) in self._in_flight() | self._leased():
                return f"carries traffic (holders {sorted(g.holders)}, lease {g.lease})"
            return None
        watch(self.c, self.violations, busy)

    def check(self) -> None:
        c = self.c
        self._poll()
        active = [g for g in c.groups.values() if g.active() and g.status == "granted"]
        for g in active:
            if not lit(c, g.circuits):
                self.violations.append(f"{g.job}/{g.key} in use (lease {g.lease}) but its circuits are not lit")
        for a, b in itertools.combinations(active, 2):
            if a.job == b.job and not _compatible(a.circuits, b.circuits):
                self.violations.append(f"{a.key} and {b.key} both in use with conflicting circuits")
        for rank, phase in self.phase.items():
            if phase == "holding":
                key = self.programs[rank][self.pc[rank]][2]
                g = c.groups[(rank[0], key)]
                if g.status != "granted" or rank[1] not in g.holders:
                    self.violations.append(f"{rank} is inside an op on {key} but the controller says {g.status} "
                                           f"{sorted(g.holders)}")
            for key, lease in self.leases[rank].items():
                g = c.groups[(rank[0], key)]
                if g.lease != lease["id"] or rank[1] not in g.holders and not lease["revoked"]:
                    self.violations.append(f"{rank} holds lease {lease['id']} of {key}; the controller: {g.lease} "
                                           f"{sorted(g.holders)}")
        if c.counters["unsafe_reconfigurations"]:
            self.violations.append("unsafe_reconfigurations > 0")
        for rec in c.applies:
            if not record_is_safe(rec):
                self.violations.append(f"apply record {rec}")
        assert not self.violations, f"seed {self.seed}: {self.violations[0]}"

    # -- the ranks --------------------------------------------------------------------------------------
    def _poll(self) -> None:
        for rank, fut in self.futures.items():
            if fut.done() and self.phase[rank] == "waiting":
                assert not fut.cancelled(), f"seed {self.seed}: {rank}: acquire cancelled"
                reply = fut.result()
                key = self.programs[rank][self.pc[rank]][2]
                if reply is not None:  # a lease (or the rest of one this rank is behind in)
                    self.leases[rank][key] = {"id": reply["lease"], "ops": reply.get("ops", 0) + 1, "in_op": True,
                                              "revoked": "until" in reply, "until": reply.get("until")}
                self._hold(rank)

    def _hold(self, rank) -> None:
        self.phase[rank] = "holding"
        self.joined.setdefault((rank[0], self.programs[rank][self.pc[rank]][0]), set()).add(rank[1])

    def _revoke(self, rank) -> None:
        self._poll()
        message = self.inbox[rank].pop(0)
        lease = self.leases[rank].get(message["key"])
        if lease is None or lease["id"] != message["lease"] or lease["revoked"]:
            return
        lease["revoked"] = True
        if not lease["in_op"]:
            del self.leases[rank][message["key"]]
        else:
            self.revoked_inside += 1
        self.c.ack(Ack(op="ack", job=rank[0], rank=rank[1], key=message["key"], lease=message["lease"],
                       ops=lease["ops"], inside=lease["in_op"]))

    def _may_start(self, rank, pc: int) -> bool:
        """Every member of the op left all its ops of earlier blocks."""
        job = rank[0]
        _, block, key = self.programs[rank][pc]
        for m in self.groups[(job, key)]["members"]:
            program, at = self.programs[(job, m)], self.pc[(job, m)]
            if (job, m) == rank:
                continue
            if at < len(program) and program[at][1] < block:
                return False
        return True

    def _all_past(self, job: str, block: int) -> bool:
        """Every rank of the job left all its ops of blocks before ``block``."""
        return all(self.pc[r] >= len(p) or p[self.pc[r]][1] >= block for r, p in self.programs.items() if r[0] == job)

    def _usable(self, rank, key) -> bool:
        lease = self.leases[rank].get(key)
        return lease is not None and not lease["in_op"] and (not lease["revoked"] or (
            lease["until"] is not None and lease["ops"] < lease["until"]))

    def _enter(self, rank, key) -> None:
        lease = self.leases[rank][key]
        lease["ops"] += 1
        lease["in_op"] = True
        self.under_lease_ops += 1

    def step(self, rank, *, drain: bool = False) -> bool:
        if self.inbox[rank] and (drain or self.rng.random() < 0.5):
            self._revoke(rank)
            return True
        phase, pc, program = self.phase[rank], self.pc[rank], self.programs[rank]
        if phase == "waiting" or (phase == "idle" and pc >= len(program)):
            return False
        instance, _, key = program[pc]
        g = self.groups[(rank[0], key)]
        if phase in ("idle", "prepared"):
            if not self._may_start(rank, pc):
                return False
            if g["leased"] and self._usable(rank, key):
                if not self._all_past(rank[0], program[pc][1]):
                    return False  # a training program enters a phase early only through its barrier
                self._enter(rank, key)
                self._hold(rank)
            elif phase == "idle" and not g["leased"] and self.rng.random() < self.prepare:
                acquire(self.c, rank[0], rank[1], key, op="prepare")
                self.phase[rank] = "prepared"
            else:
                fut = acquire(self.c, rank[0], rank[1], key, lease=g["leased"])
                if fut is None:
                    self._hold(rank)
                else:
                    self.phase[rank], self.futures[rank] = "waiting", fut
                    self._poll()
            return True
        # holding: the op completes once every member joined it (a sender's at once), and takes a while
        if g["sender"] != rank[1] and not set(g["members"]) <= self.joined.get((rank[0], instance), set()):
            return False
        if not drain and self.rng.random() < (0.8 if g["sender"] not in (None, rank[1]) else 0.4):
            return False  # receivers are the slowest
        self.left.setdefault((rank[0], instance), set()).add(rank[1])
        self.pc[rank] += 1
        self.phase[rank] = "idle"
        lease = self.leases[rank].get(key)
        if lease is not None and lease["in_op"]:
            lease["in_op"] = False
            if lease["revoked"] and (lease["until"] is None or lease["ops"] >= lease["until"]):
                del self.leases[rank][key]
                release(self.c, rank[0], rank[1], key)
        else:
            release(self.c, rank[0], rank[1], key)
            nxt = pc + 1 < len(program) and program[pc + 1]
            if nxt and self.prepare and self.rng.random() < self.prepare and nxt[2] not in self.leases[rank]:
                acquire(self.c, rank[0], rank[1], nxt[2], op="prepare")  # release(then_prepare=...)
        return True

    async def run(self, steps: int = 1500) -> None:
        await drive(self, steps, stop_early=True)
        assert all(f.done() and not f.cancelled() for f in self.futures.values())
        for g in self.c.groups.values():  # what is left: idle groups, and leases nobody needed back
            assert not g.waiters and not g.intents, (self.seed, g)
            assert g.status == "idle" or (g.lease is not None and not g.revoking and g.holders == g.members), \
                (self.seed, g)
        assert not self.vt.timers and not self.c._tasks


# --- fixtures: the helpers above, by name -----------------------------------------------------------------------------



@pytest.fixture(name="make")
def make_fixture():
    """A controller on an in-memory Store in virtual time: ``make(config=None, store=None) -> (c, vt)``."""
    return make


@pytest.fixture(name="hello")
def hello_fixture():
    """``hello(c, job, rank, world, **ports)``: a rank claims its ports."""
    return hello


@pytest.fixture(name="declare")
def declare_fixture():
    """``declare(c, job, key, members, circuits, phase)``: a group."""
    return declare


@pytest.fixture(name="acquire")
def acquire_fixture():
    """``acquire(c, job, rank, key, op='acquire', lease=False)``: the grant's future (None for prepare)."""
    return acquire


@pytest.fixture(name="release")
def release_fixture():
    """``release(c, job, rank, key)``."""
    return release


@pytest.fixture(name="job_of")
def job_of_fixture():
    """``job_of(c, world=4, job='j')``: rank r on port r of rail0 and rail1."""
    return job_of


@pytest.fixture(name="lit")
def lit_fixture():
    """``lit(c, circuits)``: every circuit is lit now."""
    return lit


@pytest.fixture(name="record_is_safe")
def record_is_safe_fixture():
    """``record_is_safe(rec)``: a /reconfigurations record switched no busy port."""
    return record_is_safe


@pytest.fixture(name="snapshot")
def snapshot_fixture():
    """``snapshot(c)``: state, jobs, groups and counters, to check that nothing changed."""
    return snapshot


@pytest.fixture(name="lease_pair")
def lease_pair_fixture():
    """``lease_pair() -> (c, vt, pushed)``: groups A and B that conflict on rail0."""
    return lease_pair


@pytest.fixture(name="lease_a")
def lease_a_fixture():
    """``await lease_a(c, vt)``: ranks 0 and 1 take A on a lease."""
    return lease_a


@pytest.fixture(name="Harness")
def harness_fixture():
    """The per-op harness class: ``Harness(seed, bursty=..., reuse_when_left=..., prepare=...)``."""
    return Harness


@pytest.fixture(name="LeaseHarness")
def lease_harness_fixture():
    """The lease harness class: ``LeaseHarness(seed, bursty=..., prepare=...)``."""
    return LeaseHarness


# --- a real controller process ----------------------------------------------------------------------------------------


def _ready(proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the controller exited ({proc.wait()}) before it was ready")
                info = json.loads(line)
                if info.get("event") == "ready":
                    return info
        raise AssertionError("no ready line within the timeout")
    finally:
        sel.close()


class FakeWriter:
    """A rank connection's writer without a socket: the lines the server wrote, parsed, and whether it closed."""

    def __init__(self):
        self.out, self.closed = [], False

    def write(self, data: bytes) -> None:
        self.out.extend(json.loads(line) for line in data.decode().splitlines())

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default=None):
        return default  # no socket: nothing unread


NATIVE_FRONTEND = pytest.param("native", marks=pytest.mark.skipif(
    c_compiler() is None, reason="--frontend native needs a C compiler"))


@pytest.fixture
def frontend() -> str:
    """The served controller's ``--frontend``; a test runs under both with
    ``@pytest.mark.parametrize("frontend", ["loop", NATIVE_FRONTEND])`` (which overrides this fixture)."""
    return "loop"


@pytest.fixture
def spawn(tmp_path, frontend):
    """``spawn(state, *extra_args, port=0, admin_port=0, env=None) -> (proc, ready info)``: ``lightrail controller
    serve --frontend <frontend>`` (2 rails of 8 ports, 5 ms switch) on free ports unless given (a restart passes
    the first start's), with a generated operator token (in the info) unless ``env`` sets
    ``LIGHTRAIL_OPERATOR_TOKEN``; its JSON log goes to ``tmp_path/controller-<n>.log``; every process is killed at
    teardown (continued first, if a test stopped it)."""
    started = []

    def start(state: Path, *extra: str, port: int = 0, admin_port: int = 0,
              env: dict | None = None) -> tuple[subprocess.Popen, dict]:
        log = open(tmp_path / f"controller-{len(started)}.log", "w")  # noqa: SIM115 (closed at teardown)
        proc = subprocess.Popen([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", str(port),
                                 "--admin-port", str(admin_port), "--state", str(state), "--rails", "2", "--ports",
                                 "8", "--ocs-delay", "5ms", "--frontend", frontend, *extra], stdout=subprocess.PIPE,
                                stderr=log, text=True, env=env)
        started.append((proc, log))
        info = _ready(proc)
        assert isinstance(info["startup_s"], float)  # reported, never asserted on
        # the loop every served test runs on: uvloop (the extra "service" brings it), as in production
        assert info["event_loop"] == ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
        assert info["gc_frozen_objects"] > 10_000  # the start-up's objects are out of the collector's way
        assert info["frontend"] == frontend and ("frontend_pid" in info) == (frontend == "native")
        return proc, info

    yield start
    for proc, log in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        log.close()


# -- a scripted controller on loopback (the client's side, without the real one) ------------------------------------


class Scripted:
    """A controller that records every line and answers through ``answer(message) -> reply | None`` (None:
    no reply yet; ``reply_later`` sends one). ``drop()`` closes the current connection; ``frozen`` stops
    answering while the socket stays open (a SIGSTOPped controller's kernel still accepts)."""

    def __init__(self, answer=None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer or (lambda m: {"id": m["id"], "ok": True})
        self.lines: list[list[dict]] = []  # per connection, the messages read
        self.conns: list[socket.socket] = []
        self.opened: list[float] = []  # per connection, when accepted
        self.ended: dict[int, float] = {}  # per connection, when the client's side closed (EOF read)
        self.frozen = False
        self.flapping = False  # close every connection after answering its hello
        self.accepting = threading.Event()
        self.accepting.set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepting.wait()
            with self.lock:
                self.conns.append(conn)
                self.opened.append(time.monotonic())
                self.lines.append([])
                seen = self.lines[-1]
            threading.Thread(target=self._serve, args=(conn, seen, len(self.conns) - 1), daemon=True).start()

    def _serve(self, conn: socket.socket, seen: list[dict], index: int) -> None:
        with conn, conn.makefile("rb") as reader:
            try:
                for line in reader:
                    message = json.loads(line)
                    with self.lock:
                        seen.append(message)
                    if self.frozen:
                        continue
                    reply = self.answer(message)
                    if reply is not None:
                        conn.sendall(json.dumps(reply).encode() + b"\n")
                    if self.flapping and message["op"] == "hello":
                        conn.shutdown(socket.SHUT_RDWR)
                        return
            except OSError:
                pass
            self.ended[index] = time.monotonic()

    def send(self, message: dict, conn: int = -1) -> None:
        self.conns[conn].sendall(json.dumps(message).encode() + b"\n")

    def drop(self) -> None:
        conn = self.conns[-1]
        conn.shutdown(socket.SHUT_RDWR)

    def ops(self, conn: int = -1) -> list[str]:
        with self.lock:
            return [m["op"] for m in self.lines[conn] if m["op"] != "heartbeat"]

    def messages(self, conn: int = -1) -> list[dict]:
        with self.lock:
            return [m for m in self.lines[conn] if m["op"] != "heartbeat"]

    def close(self) -> None:
        try:  # wakes the accept thread: a listener closed under a blocked accept() would go on queueing connections
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def until(check, what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` every 10 ms until it holds; an AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(name="scripted")
def scripted_fixture():
    """``make(answer=None)`` starts a :class:`Scripted` controller; all are closed after the test."""
    made = []

    def make(answer=None) -> Scripted:
        made.append(Scripted(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(name="until")
def until_fixture():
    return until
