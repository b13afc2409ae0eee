"""The OCS controller: ownership, group validation, barrier, skip-if-present, safety under random
interleavings (no reconfiguration of a port that carries traffic), restart from SQLite, and the real
service (rank protocol over TCP, admin API over HTTP, SIGKILL + restart, SIGTERM) and its CLI."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import random
import selectors
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.client import ControllerClient, ControllerError
from lightrail.runtime.controller.config import ControllerConfig, DeviceConfig, default_config
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import Ack, Acquire, Bye, Group, Hello, Release
from lightrail.runtime.controller.store import Store
from lightrail.runtime.ocs import changed_ports

# --- virtual time and helpers ---------------------------------------------------------------------------


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


# --- hello: ports and ownership -------------------------------------------------------------------------


def test_hello_claims_ports_and_refuses_a_port_another_job_owns():
    async def run():
        c, _ = make()
        assert hello(c, "a", 0, 2, rail0=0, rail1=0) == {"registered": 1, "world": 2}
        assert hello(c, "a", 0, 2, rail0=0, rail1=0) == {"registered": 1, "world": 2}  # idempotent
        assert c.state()["owners"]["rail0"] == {"0": "a"}
        before = snapshot(c), c.store.jobs()
        with pytest.raises(InfeasibleError) as e:
            hello(c, "b", 0, 1, rail1=5, rail0=0)
        assert e.value.field == "ports.rail0" and "'a'" in e.value.message
        with pytest.raises(InfeasibleError) as e:  # another rank of the same job cannot take it either
            hello(c, "a", 1, 2, rail0=0)
        assert e.value.field == "ports.rail0"
        assert (snapshot(c), c.store.jobs()) == before
        assert "b" not in c.jobs and c.owner[("rail1", 0)] == "a" and ("rail1", 5) not in c.owner
        for bad, field in (({"rail9": 1}, "ports.rail9"), ({"rail0": 8}, "ports.rail0")):
            with pytest.raises(ScenarioError) as e:
                hello(c, "b", 0, 1, **bad)
            assert e.value.field == field
        with pytest.raises(ScenarioError) as e:
            hello(c, "a", 1, 3, rail0=1)
        assert e.value.field == "world"
        assert (snapshot(c), c.store.jobs()) == before
        # a rank that moves gives its old port back
        hello(c, "a", 0, 2, rail0=3)
        assert c.state()["owners"]["rail0"] == {"3": "a"} and c.state()["owners"]["rail1"] == {}
        hello(c, "b", 0, 1, rail0=0)
        assert c.state()["owners"]["rail0"] == {"0": "b", "3": "a"}

    asyncio.run(run())


# --- group declaration ----------------------------------------------------------------------------------

BAD_GROUPS = [
    ("port not owned", [0, 1], {"rail0": {0: 5}}, InfeasibleError, "circuits.rail0"),
    ("port of another job", [0, 1], {"rail0": {0: 6}}, InfeasibleError, "circuits.rail0"),
    ("two inputs on one output", [0, 1, 2], {"rail0": {0: 1, 2: 1}}, InfeasibleError, "circuits.rail0"),
    ("unknown device", [0, 1], {"rail7": {0: 1}}, ScenarioError, "circuits.rail7"),
    ("port out of range", [0, 1], {"rail0": {0: 99}}, ScenarioError, "circuits.rail0"),
    ("negative port", [0, 1], {"rail1": {-1: 0}}, ScenarioError, "circuits.rail1"),
    ("member outside the world", [0, 4], {"rail0": {0: 1}}, ScenarioError, "members"),
    ("re-declared with other circuits", [0, 1], {"rail0": {0: 2, 1: 0}}, ScenarioError, "key"),
    ("re-declared with other members", [0, 1, 2], {"rail0": {0: 1, 1: 0}}, ScenarioError, "key"),
]


@pytest.mark.parametrize("what,members,circuits,error,field", BAD_GROUPS, ids=[b[0] for b in BAD_GROUPS])
def test_declare_refuses_bad_groups_naming_the_field(what, members, circuits, error, field):
    async def run():
        c, _ = make()
        job_of(c)
        hello(c, "other", 0, 1, rail0=6)
        key = "dp" if what.startswith("re-declared") else "new"
        assert declare(c, "j", "dp", [0, 1], {"rail0": {0: 1, 1: 0}}) == {"key": "dp"}
        before = snapshot(c)
        groups = dict(c.groups)
        with pytest.raises(error) as e:
            declare(c, "j", key, members, circuits)
        assert e.value.field == field, e.value
        assert c.groups == groups and snapshot(c) == before

    asyncio.run(run())


def test_declare_is_idempotent_and_needs_a_known_job():
    async def run():
        c, _ = make()
        job_of(c)
        declare(c, "j", "dp", [1, 0], {"rail0": {0: 1, 1: 0}, "rail1": {}})
        g = c.groups[("j", "dp")]
        assert declare(c, "j", "dp", [0, 1], {"rail0": {0: 1, 1: 0}}) == {"key": "dp"}
        assert c.groups[("j", "dp")] is g and g.circuits == {"rail0": {0: 1, 1: 0}}
        with pytest.raises(ScenarioError) as e:
            declare(c, "nobody", "dp", [0], {})
        assert e.value.field == "job"
        with pytest.raises(ScenarioError) as e:
            acquire(c, "j", 2, "dp")  # not a member
        assert e.value.field == "rank"
        with pytest.raises(ScenarioError) as e:
            acquire(c, "j", 0, "nope")
        assert e.value.field == "key"

    asyncio.run(run())


def test_declare_on_a_duplex_device_needs_both_directions():
    config = ControllerConfig(devices=[DeviceConfig(name="d", ports=4, duplex=True)])

    async def run():
        c, _ = make(config)
        hello(c, "j", 0, 2, d=0)
        hello(c, "j", 1, 2, d=1)
        with pytest.raises(InfeasibleError) as e:
            declare(c, "j", "g", [0, 1], {"d": {0: 1}})
        assert e.value.field == "circuits.d" and not c.groups
        declare(c, "j", "g", [0, 1], {"d": {0: 1, 1: 0}})

    asyncio.run(run())


# --- barrier, skip-if-present, provisioned mode ---------------------------------------------------------


def test_barrier_grants_only_when_every_member_acquired():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "pair", [0, 1], {"rail0": {0: 1, 1: 0}})
        f0 = acquire(c, "j", 0, "pair")
        await vt.settle()
        assert not f0.done() and c.devices["rail0"].state() == {} and c.groups[("j", "pair")].status == "idle"
        assert c.jobs_view()["j"]["groups"]["pair"]["waiting"] == [0]
        t0 = vt.now
        f1 = acquire(c, "j", 1, "pair")
        assert not f1.done()  # the switch takes its delay
        await vt.settle()
        assert f0.done() and f1.done() and f0.result() is None
        assert vt.now - t0 == pytest.approx(0.010)
        assert c.devices["rail0"].state() == {0: 1, 1: 0} and c.devices["rail0"].reconfigurations == 1
        g = c.groups[("j", "pair")]
        assert g.status == "granted" and g.holders == {0, 1}
        assert c.counters["grants"] == 1 and c.counters["grants_without_change"] == 0
        assert c.store.circuits() == {"rail0": {0: 1, 1: 0}}
        assert c.store.counters()["reconfigurations:rail0"] == 1
        assert sorted(c.latencies) == pytest.approx([0.010, 0.010])  # both waited from t0 (rank 0 asked at t0 too)
        release(c, "j", 0, "pair")
        assert g.status == "granted" and g.holders == {1}
        release(c, "j", 1, "pair")
        assert g.status == "idle" and not g.holders and not g.intents

    asyncio.run(run())


def test_second_round_is_granted_without_touching_the_switch():
    async def run():
        c, vt = make()
        job_of(c)
        circuits = {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}, "rail1": {0: 3, 3: 0}}
        declare(c, "j", "ring", range(4), circuits)
        for round_ in range(3):
            futures = [acquire(c, "j", r, "ring") for r in range(4)]
            await vt.settle()
            assert all(f.done() for f in futures)
            assert lit(c, circuits)
            for r in range(4):
                release(c, "j", r, "ring")
            await vt.settle()
            assert c.devices["rail0"].reconfigurations == 1 and c.devices["rail1"].reconfigurations == 1
            assert c.counters["grants_without_change"] == round_
            assert c.counters["grants"] == round_ + 1
        assert len(c.applies) == 2  # one per device, in the first round

    asyncio.run(run())


def test_skip_if_present_grants_synchronously():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "pair", [0, 1], {"rail0": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        for r in (0, 1):
            release(c, "j", r, "pair")
        before = vt.now, c.devices["rail0"].reconfigurations
        f0, f1 = (acquire(c, "j", r, "pair") for r in (0, 1))
        assert f0.done() and f1.done() and not vt.timers  # no await needed: nothing to reconfigure
        assert (vt.now, c.devices["rail0"].reconfigurations) == before

    asyncio.run(run())


def test_provisioned_prepare_reconfigures_before_anyone_acquires():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "b", [0, 1], {"rail0": {0: 2, 1: 3}})  # conflicts with a on inputs 0, 1
        assert acquire(c, "j", 0, "a", op="prepare") is None
        await vt.settle()
        assert c.devices["rail0"].state() == {}  # one member asked: nothing yet
        assert acquire(c, "j", 1, "a", op="prepare") is None
        await vt.settle()
        assert c.devices["rail0"].state() == {0: 1, 1: 0}  # lit before anyone acquires
        n, t = c.devices["rail0"].reconfigurations, vt.now
        f0 = acquire(c, "j", 0, "a")
        assert not f0.done()  # the barrier: rank 1 has not acquired yet
        f1 = acquire(c, "j", 1, "a")
        assert f0.done() and f1.done() and not vt.timers  # granted at once, without the switch
        assert (c.devices["rail0"].reconfigurations, vt.now) == (n, t)
        assert c.groups[("j", "a")].status == "granted" and list(c.latencies)[-2:] == [0.0, 0.0]
        assert c.counters["grants_without_change"] == 1
        # release + prepare of the next phase (what ControllerClient.release(then_prepare=) sends)
        release(c, "j", 0, "a")
        acquire(c, "j", 0, "b", op="prepare")
        await vt.settle()
        assert c.devices["rail0"].state() == {0: 1, 1: 0}  # rank 1 still holds a: b waits
        release(c, "j", 1, "a")
        acquire(c, "j", 1, "b", op="prepare")
        await vt.settle()
        assert c.devices["rail0"].state() == {0: 2, 1: 3}
        fs = [acquire(c, "j", r, "b") for r in (0, 1)]
        assert all(f.done() for f in fs) and c.devices["rail0"].reconfigurations == n + 1

    asyncio.run(run())


def test_conflicting_group_waits_for_the_holders_to_release():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "b", [2, 3], {"rail0": {2: 1, 3: 0}})  # same outputs
        fa = [acquire(c, "j", r, "a") for r in (0, 1)]
        await vt.settle()
        fb = [acquire(c, "j", r, "b") for r in (2, 3)]
        await vt.settle()
        assert all(f.done() for f in fa) and not any(f.done() for f in fb)
        release(c, "j", 0, "a")
        await vt.settle()
        assert not any(f.done() for f in fb) and c.devices["rail0"].state() == {0: 1, 1: 0}
        release(c, "j", 1, "a")
        await vt.settle()
        assert all(f.done() for f in fb) and c.devices["rail0"].state() == {2: 1, 3: 0}
        assert c.counters["unsafe_reconfigurations"] == 0
        for rec in c.applies:
            assert record_is_safe(rec)

    asyncio.run(run())


def test_disconnect_and_bye_drop_waiters_and_free_ports():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        f0 = acquire(c, "j", 0, "a")
        c.disconnect("j", 0)
        assert f0.cancelled() and not c.groups[("j", "a")].intents
        f1 = acquire(c, "j", 1, "a")
        c.bye(Bye(op="bye", job="j"))
        assert f1.cancelled() and not c.groups and "j" not in c.jobs and not c.owner
        assert c.store.jobs() == {}
        hello(c, "k", 0, 1, rail0=0)  # the port is free again
        await vt.settle()

    asyncio.run(run())


def test_bye_of_one_rank_frees_its_ports_and_the_last_one_ends_the_job():
    async def run():
        c, vt = make()
        job_of(c, world=2)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "a") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        assert c.bye(Bye(op="bye", job="j", rank=1)) == {"remaining": 1}
        assert ("rail0", 1) not in c.owner and c.owner[("rail0", 0)] == "j"
        assert c.store.jobs() == {"j": {"world": 2, "ranks": {0: {"rail0": 0, "rail1": 0}}}}
        g = c.groups[("j", "a")]
        assert g.holders == {0}  # rank 0 still uses the circuit: port 1 stays busy for everyone
        hello(c, "k", 0, 1, rail0=1)
        with pytest.raises(InfeasibleError):
            c.configure("rail0", {1: None}, job="k")
        with pytest.raises(ScenarioError) as e:
            c.bye(Bye(op="bye", job="j", rank=1))
        assert e.value.field == "rank"
        assert c.bye(Bye(op="bye", job="j", rank=0)) == {"remaining": 0}
        assert "j" not in c.jobs and not [k for k in c.groups if k[0] == "j"] and "j" not in c.store.jobs()

    asyncio.run(run())


# --- admin configure ------------------------------------------------------------------------------------


ADMIN_BAD = [
    ("two inputs on one output", "rail0", {5: 7, 6: 7}, None, InfeasibleError, "configuration."),
    ("another job's port", "rail0", {4: 7}, None, InfeasibleError, "changes.4"),
    ("another job's port, as j", "rail0", {4: 7}, "j", InfeasibleError, "changes.4"),
    ("a job's port without job", "rail0", {2: 3}, None, InfeasibleError, "changes."),
    ("a job's port as another job", "rail0", {2: 3}, "other", InfeasibleError, "changes."),
    ("busy port (darken)", "rail0", {0: None}, "j", InfeasibleError, "changes.0"),
    ("busy port (move)", "rail0", {1: 2}, "j", InfeasibleError, "changes."),
    ("busy output fed twice", "rail0", {2: 1}, "j", InfeasibleError, "configuration.2"),
    ("unknown device", "rail9", {5: 6}, None, ScenarioError, "device"),
    ("port out of range", "rail0", {5: 8}, None, ScenarioError, "changes.8"),
]


@pytest.mark.parametrize("what,device,changes,job,error,field", ADMIN_BAD, ids=[b[0] for b in ADMIN_BAD])
def test_admin_configure_refuses_and_changes_nothing(what, device, changes, job, error, field):
    async def run():
        c, vt = make()
        job_of(c)
        hello(c, "other", 0, 1, rail0=4)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "a") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        out = c.configure("rail0", {5: 6})  # unowned ports: any operator change
        assert out["completes_in_s"] == pytest.approx(0.010) and out["circuits"] == {0: 1, 1: 0, 5: 6}
        before = snapshot(c), c.store.circuits()
        with pytest.raises(error) as e:
            c.configure(device, changes, job=job)
        assert e.value.field.startswith(field), e.value
        assert (snapshot(c), c.store.circuits()) == before
        # once released, the owner may change its own ports
        for r in (0, 1):
            release(c, "j", r, "a")
        c.configure("rail0", {0: None, 1: None, 2: 3}, job="j")
        assert c.devices["rail0"].state() == {2: 3, 5: 6} == c.store.circuits()["rail0"]

    asyncio.run(run())


def test_admin_configure_does_not_switch_another_jobs_output():
    async def run():
        c, _ = make()
        c.configure("rail0", {0: 3})  # an operator's circuit before any job
        hello(c, "A", 0, 1, rail0=0)
        hello(c, "B", 0, 1, rail0=3)
        with pytest.raises(InfeasibleError) as e:
            c.configure("rail0", {0: 5}, job="A")
        assert e.value.field == "changes.3"
        assert c.devices["rail0"].state() == {0: 3}

    asyncio.run(run())


# --- restart from the SQLite file -----------------------------------------------------------------------


def test_restart_on_the_same_file_restores_circuits_and_owners(tmp_path):
    path = tmp_path / "c.db"
    config = default_config(rails=2, ports=8, delay=0.010)

    async def first():
        c, vt = make(config, Store(path))
        job_of(c)
        hello(c, "k", 0, 1, rail1=7)
        declare(c, "j", "ring", range(4), {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}})
        declare(c, "j", "pair", [0, 1], {"rail1": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "ring") for r in range(4)] + [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        c.configure("rail1", {5: 6})
        state = c.state()
        c.store.close()
        return state, fs

    state, _ = asyncio.run(first())
    assert state["devices"]["rail0"]["circuits"] == {"0": 1, "1": 2, "2": 3, "3": 0}
    assert state["devices"]["rail1"]["circuits"] == {"0": 1, "1": 0, "5": 6}
    assert state["owners"]["rail1"]["7"] == "k"

    async def second():
        store = Store(path)
        c, vt = make(config, store)
        assert c.state() == state
        persisted = Store(path).circuits()
        assert {d: drv.state() for d, drv in c.devices.items() if drv.state()} == persisted
        # the restored circuits count as lit: the same group is granted without a reconfiguration
        declare(c, "j", "ring", range(4), {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}})
        fs = [acquire(c, "j", r, "ring") for r in range(4)]
        await vt.settle()
        assert all(f.done() for f in fs) and c.counters["grants_without_change"] == 1
        assert c.devices["rail0"].reconfigurations == 0
        with pytest.raises(InfeasibleError):  # ownership survived too
            hello(c, "x", 0, 1, rail1=7)

    asyncio.run(second())


# --- safety under random interleavings ------------------------------------------------------------------

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


@pytest.mark.parametrize("seeds", [range(0, 50), range(50, 100)], ids=["seeds0-49", "seeds50-99"])
def test_safety_random_interleavings(seeds):
    """One message at a time (the controller settles in between), any order of ranks: never a
    reconfiguration under traffic, never two held groups with conflicting circuits, never a grant
    before the barrier, and every rank finishes its program (no deadlock)."""
    reconfigurations = grants_without_change = 0
    for seed in seeds:
        h = Harness(seed, bursty=False)
        asyncio.run(h.run())
        assert h.c.counters["unsafe_reconfigurations"] == 0
        reconfigurations += sum(d.reconfigurations for d in h.c.devices.values())
        grants_without_change += h.c.counters["grants_without_change"]
    assert reconfigurations > 5 * len(seeds) and grants_without_change > len(seeds)  # not vacuous


def test_safety_random_interleavings_pipelined_requests():
    """Messages that arrive together (several ranks' requests before the loop runs the controller's
    tasks, an acquire that leaves the previous group) and switch delays that end at random moments."""
    for seed in range(100):
        asyncio.run(Harness(seed, bursty=True).run())


def test_random_interleavings_with_prepare_settle():
    """Like test_safety_random_interleavings, with some ranks announcing their next group (prepare)."""
    for seed in range(100):
        asyncio.run(Harness(seed, bursty=False, prepare=0.3).run())


def test_liveness_random_programs_reusing_a_group_soon():
    """Like test_safety_random_interleavings, but a rank may ask for a group again as soon as its own
    program reaches it (not only once every member left the group's previous use)."""
    for seed in range(20):
        asyncio.run(Harness(seed, bursty=False, reuse_when_left=False).run())


def test_random_interleavings_everything_at_once():
    for seed in range(100):
        asyncio.run(Harness(seed, bursty=True, prepare=0.3, reuse_when_left=False).run())


def _lit_pair_then_conflict(c: Controller) -> None:
    job_of(c)
    declare(c, "j", "H", [2, 3], {"rail0": {2: 1}})  # lit first, then released (still lit)
    declare(c, "j", "G", [0, 1], {"rail0": {0: 1}})  # needs output 1: darkens 2 -> 1


def test_skip_if_present_does_not_grant_circuits_a_scheduled_reconfiguration_darkens():
    async def run():
        c, vt = make()
        _lit_pair_then_conflict(c)
        fs = [acquire(c, "j", r, "H") for r in (2, 3)]
        await vt.settle()
        for r in (2, 3):
            release(c, "j", r, "H")
        assert c.devices["rail0"].state() == {2: 1}
        # G's members, then H's members, before the loop runs again (pipelined / concurrent requests)
        fs = [acquire(c, "j", r, "G") for r in (0, 1)] + [acquire(c, "j", r, "H") for r in (2, 3)]
        await vt.settle()
        h = c.groups[("j", "H")]
        assert not (h.status == "granted" and h.holders and not lit(c, h.circuits)), \
            f"H is held by {sorted(h.holders)} but rail0 is {c.devices['rail0'].state()}"
        assert sum(f is None or f.done() for f in fs) == 2  # one group runs, the other waits for it

    asyncio.run(run())


def test_one_acquire_that_frees_a_port_and_completes_a_lit_group_is_safe():
    async def run():
        c, vt = make()
        _lit_pair_then_conflict(c)
        declare(c, "j", "K", [3], {"rail0": {0: 3}})  # holds input 0, which G switches
        fs = [acquire(c, "j", r, "H") for r in (2, 3)]
        await vt.settle()
        assert all(f.done() for f in fs)
        for r in (2, 3):
            release(c, "j", r, "H")
        fk = acquire(c, "j", 3, "K")
        await vt.settle()
        assert fk.done()
        fg = [acquire(c, "j", r, "G") for r in (0, 1)]
        vt.now += 0.001  # G is ready first, so it is scheduled first
        f2 = acquire(c, "j", 2, "H")
        await vt.settle()
        assert not any(f.done() for f in fg + [f2])  # G waits for K; H for rank 3
        f3 = acquire(c, "j", 3, "H")  # one message: rank 3 leaves K (freeing G) and completes H
        await vt.settle()
        h = c.groups[("j", "H")]
        assert not (h.status == "granted" and h.holders and not lit(c, h.circuits)), \
            f"H is held by {sorted(h.holders)} but rail0 is {c.devices['rail0'].state()}"
        assert sum(f.done() for f in [*fg, f2, f3]) == 2  # one group runs, the other waits for it

    asyncio.run(run())


def test_reacquiring_a_granted_group_waits_for_the_next_round():
    """Rank 0 runs A, B, A; rank 1 runs A, A; rank 2 runs B. A and B share port 0."""
    async def run():
        c, vt = make()
        job_of(c, world=3)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "B", [0, 2], {"rail0": {0: 2, 2: 0}})
        fa = [acquire(c, "j", r, "A") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fa)
        release(c, "j", 1, "A")  # rank 1 is done with its first A ...
        acquire(c, "j", 1, "A")  # ... and starts its second A (it waits for rank 0 in the collective)
        release(c, "j", 0, "A")  # rank 0 is done with its first A and moves on to B, with rank 2
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]
        await vt.settle()
        assert all(f.done() for f in fb), (
            f"B waits for port 0, held by rank 1 in a second round of A that rank 0 cannot join before B: "
            f"A={c.jobs_view()['j']['groups']['A']}")

    asyncio.run(run())


def test_two_conflicting_prepared_groups_do_not_thrash_the_switch():
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "X", [0, 1], {"rail0": {0: 1}})
        declare(c, "j", "Y", [2, 3], {"rail0": {2: 1}})  # the same output
        for r, key in ((0, "X"), (1, "X"), (2, "Y"), (3, "Y")):
            assert acquire(c, "j", r, key, op="prepare") is None
        for _ in range(50):  # 50 switch delays with no request
            for _ in range(3):
                await asyncio.sleep(0)
            vt.fire()
        assert c.devices["rail0"].reconfigurations <= 2, (
            f"{c.devices['rail0'].reconfigurations} reconfigurations while no rank acquired "
            f"(last: {[a['group'] for a in list(c.applies)[-4:]]})")
        # the group lit first is granted at once when its members acquire
        lit_group = "X" if c.devices["rail0"].state().get(0) == 1 else "Y"
        ranks = (0, 1) if lit_group == "X" else (2, 3)
        fs = [acquire(c, "j", r, lit_group) for r in ranks]
        assert all(f.done() for f in fs)

    asyncio.run(run())


# --- leases ---------------------------------------------------------------------------------------------


def ack(c: Controller, job: str, rank: int, key: str, lease: int, ops: int, inside: bool = False) -> dict:
    return c.ack(Ack(op="ack", job=job, rank=rank, key=key, lease=lease, ops=ops, inside=inside))


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


def test_a_lease_holds_across_ops_until_another_group_needs_its_ports():
    async def run():
        c, vt, pushed = lease_pair()
        fa = [acquire(c, "j", r, "A", lease=True) for r in (0, 1)]
        await vt.settle()
        assert [f.result() for f in fa] == [{"lease": 1}, {"lease": 1}]
        g = c.groups[("j", "A")]
        assert (g.status, g.lease, g.holders, c.intent) == ("granted", 1, {0, 1}, {})
        assert c.lease_of("j", "A", 0) == 1 and c.counters["leases"] == 1
        await vt.settle()
        assert not pushed and g.active()  # nobody else wants the ports: the lease stands, nothing is sent
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]
        await vt.settle()
        assert not any(f.done() for f in fb)
        assert sorted(pushed) == [(0, {"op": "revoke", "job": "j", "rank": 0, "key": "A", "lease": 1}),
                                  (1, {"op": "revoke", "job": "j", "rank": 1, "key": "A", "lease": 1})]
        assert ack(c, "j", 0, "A", 1, ops=3) == {}
        await vt.settle()
        assert not any(f.done() for f in fb) and c.devices["rail0"].state() == {0: 1, 1: 0}  # rank 1 still holds
        assert ack(c, "j", 1, "A", 1, ops=3) == {}
        assert g.status == "idle" and g.lease is None and not g.active()
        await vt.settle()
        assert all(f.done() for f in fb) and c.devices["rail0"].state() == {0: 2, 2: 0}
        assert ack(c, "j", 1, "A", 1, ops=3) == {"stale": True}  # answered twice: ignored
        assert c.counters["revocations"] == 1 and c.counters["unsafe_reconfigurations"] == 0
        assert all(record_is_safe(r) for r in c.applies)
        # the next op on A re-acquires: barrier again, after B's members release
        for r in (0, 2):
            release(c, "j", r, "B")
        fa = [acquire(c, "j", r, "A", lease=True) for r in (0, 1)]
        await vt.settle()
        assert [f.result() for f in fa] == [{"lease": 2}, {"lease": 2}]

    asyncio.run(run())


def test_a_holder_inside_an_op_releases_when_it_completes():
    async def run():
        c, vt, pushed = lease_pair()
        await lease_a(c, vt)
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]
        ack(c, "j", 1, "A", 1, ops=2, inside=True)
        ack(c, "j", 0, "A", 1, ops=2)  # rank 0 ran its second op (it is waiting for B now)
        await vt.settle()
        assert c.groups[("j", "A")].holders == {1} and not any(f.done() for f in fb)
        assert release(c, "j", 0, "A") == {} and c.groups[("j", "A")].holders == {1}  # rank 0 acked: a no-op
        release(c, "j", 1, "A")
        await vt.settle()
        assert all(f.done() for f in fb)

    asyncio.run(run())


def test_a_member_behind_runs_its_remaining_ops_before_the_ports_are_freed():
    """A sender finished its 4 sends under the lease, the receiver took 1 when the revoke came: the
    circuit stays lit until the receiver has the other 3 (granted at once, up to the sender's count)."""
    async def run():
        c, vt, pushed = lease_pair()
        await lease_a(c, vt)
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]  # rank 0 (the sender) moved on to B
        ack(c, "j", 0, "A", 1, ops=4)
        ack(c, "j", 1, "A", 1, ops=1)
        await vt.settle()
        g = c.groups[("j", "A")]
        assert g.status == "granted" and g.active() and not g.holders and not any(f.done() for f in fb)
        f = acquire(c, "j", 1, "A", lease=True)
        assert f.done() and f.result() == {"lease": 1, "ops": 1, "until": 4} and c.counters["rejoins"] == 1
        assert g.holders == {1} and c.devices["rail0"].state() == {0: 1, 1: 0}
        release(c, "j", 1, "A")  # after its ops 2..4
        await vt.settle()
        assert all(f.done() for f in fb) and g.status == "idle"
        assert c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_a_peer_that_acked_before_entering_the_op_another_member_waits_in_rejoins_it():
    async def run():
        c, vt, pushed = lease_pair()
        await lease_a(c, vt)
        fb = [acquire(c, "j", r, "B", op="prepare") for r in (0, 2)]  # B announced (provisioned)
        assert fb == [None, None] and len(pushed) == 2
        ack(c, "j", 0, "A", 1, ops=3, inside=True)  # rank 0 is inside its third op, waiting for rank 1
        ack(c, "j", 1, "A", 1, ops=2)
        waiting = acquire(c, "j", 1, "A", lease=True)  # rank 1's third op: it must join rank 0's
        assert waiting.done() and waiting.result() == {"lease": 1, "ops": 2, "until": 3}
        release(c, "j", 1, "A")
        release(c, "j", 0, "A")
        await vt.settle()
        assert c.devices["rail0"].state() == {0: 2, 2: 0}  # B lit while its ranks compute

    asyncio.run(run())


def test_a_lease_is_granted_only_if_every_member_asked_for_one_and_ends_only_by_revoke():
    async def run():
        c, vt, pushed = lease_pair()
        fa = [acquire(c, "j", 0, "A", lease=True), acquire(c, "j", 1, "A")]
        await vt.settle()
        assert [f.result() for f in fa] == [None, None] and c.groups[("j", "A")].lease is None
        for r in (0, 1):
            release(c, "j", r, "A")
        await lease_a(c, vt)
        with pytest.raises(ScenarioError) as e:
            release(c, "j", 0, "A")
        assert e.value.field == "key" and "ack" in e.value.message
        assert ack(c, "j", 0, "A", 1, ops=1) == {"stale": True}  # not revoked: an ack changes nothing
        assert c.groups[("j", "A")].holders == {0, 1}

    asyncio.run(run())


def test_a_disconnected_ranks_leases_vanish():
    async def run():
        c, vt, pushed = lease_pair()
        await lease_a(c, vt)
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]
        await vt.settle()
        ack(c, "j", 0, "A", 1, ops=1)
        c.disconnect("j", 1)  # rank 1 dies holding the lease
        await vt.settle()
        assert all(f.done() for f in fb) and c.groups[("j", "A")].status == "idle"
        c.bye(Bye(op="bye", job="j"))
        assert not c.groups

    asyncio.run(run())


# --- leases under random interleavings ------------------------------------------------------------------


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


@pytest.mark.parametrize(("bursty", "prepare"), [(False, 0.0), (True, 0.3)], ids=["settled", "bursty-prepare"])
def test_leases_random_programs_safe_and_live(bursty, prepare):
    """100 seeds of leased and per-op groups (several ops per lease, revocations in the middle of ops,
    senders ahead of receivers): never a switched port of a group in use, leased and not yet given
    back, or with data in flight; never two conflicting groups in use; never a grant before the
    barrier; every program finishes."""
    totals = {"under_lease": 0, "revocations": 0, "inside": 0, "rejoins": 0, "reconfigurations": 0}
    for seed in range(100):
        h = LeaseHarness(seed, bursty=bursty, prepare=prepare)
        asyncio.run(h.run())
        totals["under_lease"] += h.under_lease_ops
        totals["revocations"] += h.c.counters["revocations"]
        totals["inside"] += h.revoked_inside
        totals["rejoins"] += h.c.counters["rejoins"]
        totals["reconfigurations"] += sum(d.reconfigurations for d in h.c.devices.values())
    assert totals["under_lease"] > 2000 and totals["revocations"] > 60 and totals["inside"] > 10, totals
    assert totals["rejoins"] > 1 and totals["reconfigurations"] > 400, totals  # not vacuous


# --- the real service -----------------------------------------------------------------------------------


def _ready(proc: subprocess.Popen, timeout: float = 30.0) -> dict:
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


@pytest.fixture
def spawn(tmp_path):
    """Start ``lightrail controller serve`` on a state file; every process is killed at teardown."""
    started = []

    def start(state: Path) -> tuple[subprocess.Popen, dict]:
        log = open(tmp_path / f"controller-{len(started)}.log", "w")  # closed at teardown
        proc = subprocess.Popen([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", "0",
                                 "--admin-port", "0", "--state", str(state), "--rails", "2", "--ports", "8",
                                 "--delay", "5ms"], stdout=subprocess.PIPE, stderr=log, text=True)
        started.append((proc, log))
        info = _ready(proc)
        assert isinstance(info["startup_s"], float)  # reported, never asserted on
        return proc, info

    yield start
    for proc, log in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        log.close()


def _metrics(admin: str) -> dict[str, float]:
    text = httpx.get(f"{admin}/metrics", timeout=10).text
    return {name: float(value) for name, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def _clients(info: dict, job: str, world: int) -> list[ControllerClient]:
    return [ControllerClient(info["host"], info["port"], job=job, rank=r, timeout=20) for r in range(world)]


def test_service_ranks_barrier_state_metrics_and_sigterm(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db")
    admin = f"http://{info['host']}:{info['admin_port']}"
    assert httpx.get(f"{admin}/healthz", timeout=10).json() == {"ok": True}
    ranks = _clients(info, "train", 4)
    ring = {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}}
    pair = {"rail1": {0: 1, 1: 0}}
    with ThreadPoolExecutor(4) as pool:
        hellos = [pool.submit(c.hello, 4, {"rail0": r, "rail1": r}) for r, c in enumerate(ranks)]
        assert sorted(f.result(timeout=20)["registered"] for f in hellos) == [1, 2, 3, 4]
        for c in ranks:  # every rank declares the same groups (idempotent)
            c.declare("dp", range(4), ring, phase="dp")
            c.declare("pp", [0, 1], pair, phase="pp")
        # barrier: rank 0's acquire is not answered until the last member asked
        first = pool.submit(ranks[0].acquire, "dp")
        time.sleep(0.3)
        assert not first.done()
        jobs = httpx.get(f"{admin}/jobs", timeout=10).json()
        assert jobs["train"]["groups"]["dp"]["waiting"] == [0]
        rest = [pool.submit(c.acquire, "dp") for c in ranks[1:]]
        assert all(f.result(timeout=20)["granted"] for f in [first, *rest])
        assert httpx.get(f"{admin}/jobs", timeout=10).json()["train"]["groups"]["dp"]["holders"] == [0, 1, 2, 3]
        list(pool.map(lambda c: c.release("dp"), ranks))
        for _ in range(2):  # more rounds: no reconfiguration
            assert all(f.result(timeout=20)["granted"] for f in [pool.submit(c.acquire, "dp") for c in ranks])
            list(pool.map(lambda c: c.release("dp"), ranks))
        # provisioned: release + prepare pipelined, then acquire
        list(pool.map(lambda c: c.prepare("pp"), ranks[:2]))
        assert all(f.result(timeout=20)["granted"] for f in [pool.submit(c.acquire, "pp") for c in ranks[:2]])
        list(pool.map(lambda c: c.release("pp"), ranks[:2]))
    with pytest.raises(ControllerError) as e:
        ranks[2].acquire("pp")
    assert e.value.field == "rank"
    state = httpx.get(f"{admin}/state", timeout=10).json()
    assert state["devices"]["rail0"]["circuits"] == {"0": 1, "1": 2, "2": 3, "3": 0}
    assert state["devices"]["rail1"]["circuits"] == {"0": 1, "1": 0}
    assert state["owners"]["rail0"] == {str(r): "train" for r in range(4)}
    m = _metrics(admin)
    assert m['lightrail_reconfigurations_total{device="rail0"}'] == 1
    assert m['lightrail_reconfigurations_total{device="rail1"}'] == 1
    assert m["lightrail_unsafe_reconfigurations_total"] == 0
    assert m["lightrail_grants_without_change_total"] == 2
    assert m["lightrail_acquire_latency_seconds_count"] == 3 * 4 + 2
    for q in ("0.5", "0.9", "0.99"):
        assert f'lightrail_acquire_latency_seconds{{quantile="{q}"}}' in m
    assert m['lightrail_acquire_latency_seconds{quantile="0.99"}'] >= 0.005 * 0.9  # the 5 ms switch delay
    recs = httpx.get(f"{admin}/reconfigurations", timeout=10).json()
    assert [r["device"] for r in recs] == ["rail0", "rail1"]
    assert all(record_is_safe(r) for r in recs)
    for c in ranks:
        c.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_service_lease_revoke_pushed_acked_then_switched(spawn, tmp_path):
    """Real server, real clients: ops under a lease send nothing; another group's acquire makes the
    controller push revokes, which the clients' reader threads answer (at once, or as inside an op,
    releasing when it completes); only then does the switch change."""
    proc, info = spawn(tmp_path / "c.db")
    admin = f"http://{info['host']}:{info['admin_port']}"
    ranks = _clients(info, "train", 3)
    a, b = {"rail0": {0: 1, 1: 0}}, {"rail0": {0: 2, 2: 0}}  # B switches A's ports
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda rc: rc[1].hello(3, {"rail0": rc[0]}), enumerate(ranks)))
        for c in ranks:
            c.declare("A", [0, 1], a, phase="dp")
            c.declare("B", [0, 2], b, phase="pp")
        leases = {f.result(timeout=20)["lease"] for f in [pool.submit(c.acquire, "A", lease=True) for c in ranks[:2]]}
        assert len(leases) == 1
        sent = [c.requests for c in ranks]
        for c in ranks[:2]:
            c.leave("A")  # the op the lease was granted for
            for _ in range(5):
                assert c.enter("A")
                c.leave("A")
        assert [c.requests for c in ranks] == sent  # no request while the lease stands
        assert ranks[0].enter("A") and ranks[1].enter("A")
        ranks[0].leave("A")  # rank 0 is done with the op; rank 1 is still inside it when the revoke comes
        fb = [pool.submit(c.acquire, "B") for c in (ranks[0], ranks[2])]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            view = httpx.get(f"{admin}/jobs", timeout=10).json()["train"]["groups"]["A"]
            if view["revoking"] and view["holders"] == [1]:
                break
            time.sleep(0.02)
        assert view["revoking"] and view["holders"] == [1], view  # rank 0 acked at once, from its reader thread
        assert not any(f.done() for f in fb) and not ranks[0].holds("A")
        assert httpx.get(f"{admin}/state", timeout=10).json()["devices"]["rail0"]["circuits"] == {"0": 1, "1": 0}
        ranks[1].leave("A")  # the op completes: the release goes out
        assert all(f.result(timeout=20)["granted"] for f in fb)
    assert httpx.get(f"{admin}/state", timeout=10).json()["devices"]["rail0"]["circuits"] == {"0": 2, "2": 0}
    recs = httpx.get(f"{admin}/reconfigurations", timeout=10).json()
    assert [r["group"] for r in recs] == ["A", "B"] and all(record_is_safe(r) for r in recs)
    m = _metrics(admin)
    assert m["lightrail_leases_total"] == 1 and m["lightrail_revocations_total"] == 1
    assert m["lightrail_unsafe_reconfigurations_total"] == 0
    for c in ranks:
        c.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_service_refuses_bad_requests_and_stays_up(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db")
    admin = f"http://{info['host']}:{info['admin_port']}"
    with socket.create_connection((info["host"], info["port"]), timeout=10) as s:
        f = s.makefile("rb")

        def ask(line: bytes) -> dict:
            s.sendall(line + b"\n")
            return json.loads(f.readline())

        r = ask(b'{"op": "hello", "job": ')
        assert r["ok"] is False and r["error"]["field"] == "message"
        r = ask(b"[1, 2]")
        assert r["ok"] is False and r["error"]["field"] == "message"
        r = ask(json.dumps({"id": 3, "op": "hello", "job": "x", "rank": 0, "world": 1, "ports": {"rail0": 5},
                            "colour": "red"}).encode())
        assert r["ok"] is False and "colour" in r["error"]["field"]
        r = ask(json.dumps({"id": 4, "op": "teleport", "job": "x"}).encode())
        assert r["ok"] is False and r["error"]["field"]
        x_hello = {"op": "hello", "job": "x", "rank": 0, "world": 1}
        r = ask(json.dumps({"id": 5, **x_hello, "ports": {"rail0": 99}}).encode())
        assert r == {"id": 5, "ok": False, "error": r["error"]} and r["error"]["field"] == "ports.rail0"
        r = ask(json.dumps({"id": 6, **x_hello, "ports": {"rail0": 5}}).encode())
        assert r == {"id": 6, "ok": True, "registered": 1, "world": 1}
        r = ask(json.dumps({"id": 7, "op": "acquire", "job": "x", "rank": 0, "key": "nope"}).encode())
        assert r["ok"] is False and r["id"] == 7 and r["error"]["field"] == "key"
    assert httpx.get(f"{admin}/healthz", timeout=10).json() == {"ok": True}
    assert httpx.get(f"{admin}/state", timeout=10).json()["owners"]["rail0"] == {"5": "x"}
    assert _metrics(admin)["lightrail_request_errors_total"] == 6
    # a rank on a new connection is served normally
    c = ControllerClient(info["host"], info["port"], job="y", rank=0, timeout=20)
    assert c.hello(1, {"rail1": 3})["registered"] == 1
    c.close()
    assert proc.poll() is None


def test_service_admin_post_circuits_validates_and_applies(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db")
    admin = f"http://{info['host']}:{info['admin_port']}"
    c = ControllerClient(info["host"], info["port"], job="x", rank=0, timeout=20)
    c.hello(1, {"rail0": 5})
    before = httpx.get(f"{admin}/state", timeout=10).json()
    for body in ({"changes": {"6": 7, "4": 7}},  # two inputs on one output
                 {"changes": {"5": 6}},  # port 5 is job x's
                 {"changes": {"6": 99}},  # no such port
                 {"changes": {"6": 7}, "colour": 1}):  # unknown field
        r = httpx.post(f"{admin}/devices/rail0/circuits", json=body, timeout=10)
        assert r.status_code in (400, 422), (body, r.text)
        assert httpx.get(f"{admin}/state", timeout=10).json() == before
    c.close()
    r = httpx.post(f"{admin}/devices/rail0/circuits", json={"changes": {"6": 7, "4": 7}}, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["field"].startswith("configuration.")
    assert httpx.post(f"{admin}/devices/rail5/circuits", json={"changes": {}}, timeout=10).status_code == 400
    r = httpx.post(f"{admin}/devices/rail0/circuits", json={"changes": {"6": 7}}, timeout=10)
    assert r.status_code == 200 and r.json()["circuits"] == {"6": 7}
    assert httpx.get(f"{admin}/state", timeout=10).json()["devices"]["rail0"]["circuits"] == {"6": 7}


def _asgi(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://controller")


def test_admin_app_views_in_process():
    from lightrail.runtime.controller.server import admin_app, metrics_text

    async def run():
        c, vt = make()
        job_of(c, world=2)
        declare(c, "j", "pair", [0, 1], {"rail0": {0: 1, 1: 0}}, phase="dp")
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        async with _asgi(admin_app(c)) as http:
            assert (await http.get("/healthz")).json() == {"ok": True}
            assert (await http.get("/state")).json() == json.loads(json.dumps(c.state()))
            jobs = (await http.get("/jobs")).json()
            assert jobs["j"]["groups"]["pair"] == {"phase": "dp", "status": "granted", "members": [0, 1],
                                                   "holders": [0, 1], "waiting": [], "lease": None,
                                                   "revoking": False}
            (rec,) = (await http.get("/reconfigurations")).json()
            assert rec["device"] == "rail0" and rec["changed_inputs"] == rec["changed_outputs"] == [0, 1]
            assert rec["busy_inputs"] == rec["busy_outputs"] == []
            text = (await http.get("/metrics")).text
        assert text == metrics_text(c)
        lines = text.splitlines()
        assert 'lightrail_reconfigurations_total{device="rail0"} 1' in lines
        assert 'lightrail_reconfigurations_total{device="rail1"} 0' in lines
        assert 'lightrail_circuits_lit{device="rail0"} 2' in lines
        assert "# TYPE lightrail_acquire_latency_seconds summary" in lines
        assert 'lightrail_acquire_latency_seconds{quantile="0.5"} 0.01' in lines
        assert "lightrail_acquire_latency_seconds_count 2" in lines

    asyncio.run(run())


def test_admin_app_post_circuits_in_process():
    from lightrail.runtime.controller.server import admin_app

    async def run():
        c, _ = make()
        async with _asgi(admin_app(c)) as http:
            r = await http.post("/devices/rail0/circuits", json={"changes": {"2": 3}})
            assert r.status_code == 200, r.text
            assert c.devices["rail0"].state() == {2: 3}

    asyncio.run(run())


def test_service_restart_after_sigkill_keeps_circuits_and_owners(spawn, tmp_path):
    state_file = tmp_path / "c.db"
    proc, info = spawn(state_file)
    admin = f"http://{info['host']}:{info['admin_port']}"
    ranks = _clients(info, "train", 2)
    other = ControllerClient(info["host"], info["port"], job="eval", rank=0, timeout=20)
    other.hello(1, {"rail1": 7})
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda rc: rc[1].hello(2, {"rail0": rc[0], "rail1": rc[0]}), enumerate(ranks)))
        for c in ranks:
            c.declare("pair", [0, 1], {"rail0": {0: 1, 1: 0}, "rail1": {0: 1, 1: 0}})
        assert all(f.result(timeout=20)["granted"] for f in [pool.submit(c.acquire, "pair") for c in ranks])
    before = httpx.get(f"{admin}/state", timeout=10).json()
    assert before["devices"]["rail1"]["circuits"] == {"0": 1, "1": 0}
    assert before["owners"]["rail1"] == {"0": "train", "1": "train", "7": "eval"}
    proc.kill()  # SIGKILL while the ranks hold the group
    assert proc.wait(10) == -signal.SIGKILL
    for c in [*ranks, other]:
        c.close()
    proc2, info2 = spawn(state_file)
    admin2 = f"http://{info2['host']}:{info2['admin_port']}"
    after = httpx.get(f"{admin2}/state", timeout=10).json()
    assert after == before
    assert _metrics(admin2)['lightrail_reconfigurations_total{device="rail0"}'] == 1  # counters persisted
    # the restarted controller still refuses the ports to another job, and the job carries on
    intruder = ControllerClient(info2["host"], info2["port"], job="intruder", rank=0, timeout=20)
    with pytest.raises(ControllerError) as e:
        intruder.hello(1, {"rail0": 1})
    assert e.value.field == "ports.rail0"
    ranks = _clients(info2, "train", 2)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda rc: rc[1].hello(2, {"rail0": rc[0], "rail1": rc[0]}), enumerate(ranks)))
        for c in ranks:
            c.declare("pair", [0, 1], {"rail0": {0: 1, 1: 0}, "rail1": {0: 1, 1: 0}})
        assert all(f.result(timeout=20)["granted"] for f in [pool.submit(c.acquire, "pair") for c in ranks])
    assert _metrics(admin2)["lightrail_grants_without_change_total"] == 1
    for c in [*ranks, intruder]:
        c.close()
    proc2.send_signal(signal.SIGTERM)
    assert proc2.wait(15) == 0


# --- CLI: bad input fails before serving ----------------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def no_serve(monkeypatch):
    """If validation wrongly passes, record the config instead of serving forever."""
    calls = []
    monkeypatch.setattr("lightrail.runtime.controller.server.serve", lambda cfg, state, **_: calls.append(cfg))
    return calls


CONFIGS = [
    ("unknown field", "devices:\n  - {name: rail0, colour: red}\n", "devices.0.colour"),
    ("unknown top-level field", "devices:\n  - {name: rail0}\nbogus: 1\n", "bogus"),
    ("duplicate device", "devices:\n  - {name: rail0}\n  - {name: rail0, ports: 8}\n", "devices"),
    ("no ports", "devices:\n  - {name: rail0, ports: 0}\n", "devices.0.ports"),
    ("no devices", "devices: []\n", "devices"),
    ("bad delay", "devices:\n  - {name: rail0, delay: soon}\n", "delay"),
    ("not a mapping", "- rail0\n", "--config"),
    ("not yaml", "devices: [\n", "--config"),
]


@pytest.mark.parametrize("what,text,field", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_cli_bad_config_exits_2_naming_the_field(tmp_path, no_serve, what, text, field):
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["controller", "serve", "--config", str(path), "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert f"{field}:" in result.output and "Traceback" not in result.output
    assert not no_serve


@pytest.mark.parametrize("args,field", [
    (["--config", "missing.yaml"], "--config"),
    (["--rails", "0"], "--rails"),
    (["--ports", "0"], "--ports"),
    (["--delay", "soon"], "--delay"),
    (["--port", "70000"], "--port"),
    (["--admin-port", "-1"], "--admin-port"),
])
def test_cli_bad_options_exit_2_naming_the_flag(tmp_path, no_serve, args, field):
    if args[0] == "--config":
        args = ["--config", str(tmp_path / args[1])]
    result = runner.invoke(app, ["controller", "serve", *args, "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output
    assert not no_serve


def test_cli_good_config_reaches_serve_with_the_port_overrides(tmp_path, no_serve):
    path = tmp_path / "controller.json"
    path.write_text(json.dumps({"devices": [{"name": "a", "ports": 16, "delay": "25ms", "duplex": True}]}))
    result = runner.invoke(app, ["controller", "serve", "--config", str(path), "--port", "0", "--admin-port", "0",
                                 "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 0, result.output
    (cfg,) = no_serve
    assert (cfg.port, cfg.admin_port) == (0, 0)
    assert cfg.devices == [DeviceConfig(name="a", ports=16, delay=0.025, duplex=True)]
