"""Issue 17's "never granted before lit; never switched mid-switch", in virtual time: an admin change's
completion time holds back every grant on its ports and refuses a second change; the deadline survives a
restart (the issue saw a switch 0.5 s into a 2 s reconfiguration granted 1 ms after restart); ``hold``
is accepted only on lit circuits; and random programs with admin changes interleaved keep both rules."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, LightrailError
from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.store import Store
from lightrail.runtime.ocs import changed_ports, moving_ports

PAIR = {"rail0": {0: 1, 1: 0}}


def test_a_group_on_ports_an_admin_change_switches_is_granted_only_when_they_are_lit(make, declare, acquire,
                                                                                     job_of):
    async def run():
        c, vt = make(default_config(rails=2, ports=8, delay=1.0))
        job_of(c, world=2)
        declare(c, "j", "pair", [0, 1], PAIR)
        t0 = vt.now
        assert c.configure("rail0", {0: 1, 1: 0}, job="j")["completes_in_s"] == pytest.approx(1.0)
        vt.now += 0.002  # the issue: granted 2 ms later
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        assert not any(f.done() for f in fs)
        assert c.devices["rail0"].reconfigurations == 1  # lit by the admin: nothing more to switch
        await vt.settle()
        assert all(f.done() for f in fs) and vt.now == pytest.approx(t0 + 1.0)
        assert c.devices["rail0"].reconfigurations == 1 and c.counters["grants_without_change"] == 1
        assert sorted(c.latencies) == pytest.approx([0.998, 0.998])

    asyncio.run(run())


def test_moving_ports_are_the_ports_a_change_steers_not_those_it_darkens():
    before = {0: 2, 2: 0, 1: 3, 3: 1}
    after = {0: 1, 1: 0}  # 0 and 1 pair up: 2 and 3 lose their peers
    assert changed_ports(before, after) == ({0, 1, 2, 3}, {0, 1, 2, 3})
    assert moving_ports(before, after) == ({0, 1}, {0, 1})
    assert moving_ports(after, {**after, 2: 3, 3: 2}) == ({2, 3}, {2, 3})
    assert moving_ports(before, {0: 2, 2: 0}) == (set(), set())  # only darkened: nothing steers


def test_two_groups_that_darken_each_others_old_peers_switch_at_once(make, declare, acquire, job_of):
    """The train-demo's rail: PP circuits 0<->2 and 1<->3, then DP pairs 0<->1 and 2<->3. Each DP change darkens
    the ports the other steers; none steers a port the other steers, so both switch together: granted one
    delay after the ask, not one after the other (the issue's serialized switches)."""
    async def run():
        c, vt = make(default_config(rails=2, ports=8, delay=1.0))
        job_of(c, world=4)
        c.configure("rail0", {0: 2, 2: 0, 1: 3, 3: 1}, job="j")
        vt.now += 1.0
        await vt.settle()
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "b", [2, 3], {"rail0": {2: 3, 3: 2}})
        t0 = vt.now
        fa = [acquire(c, "j", r, "a") for r in (0, 1)]
        fb = [acquire(c, "j", r, "b") for r in (2, 3)]
        await vt.settle()
        assert all(f.done() for f in fa + fb) and vt.now == pytest.approx(t0 + 1.0)
        assert c.devices["rail0"].state() == {0: 1, 1: 0, 2: 3, 3: 2}
        assert c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_an_admin_change_to_a_port_still_switching_is_refused_naming_the_port_and_when(make, job_of, snapshot):
    async def run():
        c, vt = make(default_config(rails=2, ports=8, delay=1.0))
        job_of(c, world=4)
        c.configure("rail0", {0: 1, 1: 0}, job="j")
        vt.now += 0.25
        before = snapshot(c), c.store.circuits()
        for changes, port in (({0: 2}, 0), ({1: None}, 0), ({3: 1, 0: None}, 0), ({1: 3}, 0)):
            with pytest.raises(InfeasibleError) as e:
                c.configure("rail0", changes, job="j")
            assert e.value.field == f"changes.{port}" and e.value.fix == "retry after 0.750 s", e.value
        assert (snapshot(c), c.store.circuits()) == before  # refused: nothing changed anywhere
        c.configure("rail0", {2: 3, 3: 2}, job="j")  # other ports: fine
        vt.now += 0.75
        with pytest.raises(InfeasibleError) as e:  # 0 and 1 settled; 2 and 3 still switching
            c.configure("rail0", {0: 2, 2: 0, 1: None, 3: None}, job="j")
        assert e.value.field == "changes.2" and e.value.fix == "retry after 0.250 s"
        vt.now += 0.25
        c.configure("rail0", {0: 2, 2: 0, 1: None, 3: None}, job="j")
        assert c.devices["rail0"].state() == {0: 2, 2: 0}
        await vt.settle()

    asyncio.run(run())


def test_a_group_change_on_a_port_an_admin_is_switching_waits_for_it(make, declare, acquire, job_of):
    async def run():
        c, vt = make(default_config(rails=2, ports=8, delay=1.0))
        job_of(c, world=3)
        declare(c, "j", "b", [0, 2], {"rail0": {0: 2, 2: 0}})
        t0 = vt.now
        c.configure("rail0", {0: 1, 1: 0}, job="j")
        fs = [acquire(c, "j", r, "b") for r in (0, 2)]
        await vt.settle()
        assert all(f.done() for f in fs)
        group_switch = [a for a in c.applies if a["group"] == "b"]
        assert [a["at"] for a in group_switch] == [pytest.approx(t0 + 1.0)]  # not before the admin's settled
        assert vt.now == pytest.approx(t0 + 2.0)  # then its own delay
        assert c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_a_restarted_controller_still_waits_for_a_switch_under_way(tmp_path, make, hello, declare, acquire):
    """The issue: a switch 0.5 s into a 2 s reconfiguration was granted 1 ms after restart."""
    path, wall = tmp_path / "c.db", [50_000.0]
    config = default_config(rails=2, ports=8, delay=2.0)

    async def first():
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        for r in (0, 1):
            hello(c, "j", r, 2, rail0=r, rail1=r)
        declare(c, "j", "pair", [0, 1], PAIR)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]  # the group's own switch: 2 s
        await asyncio.sleep(0)
        assert not any(f.done() for f in fs) and c.devices["rail0"].state() == PAIR["rail0"]
        c.store.close()  # killed 0.5 s into the switch

    asyncio.run(first())
    wall[0] += 0.5

    async def second():
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        assert c.devices["rail0"].state() == PAIR["rail0"]  # restored lit, with no delay ...
        assert c.ports_view()["rail0"]["switching"] == {"0": pytest.approx(1.5), "1": pytest.approx(1.5)}
        t0 = vt.now
        for r in (0, 1):
            hello(c, "j", r, 2, rail0=r, rail1=r)  # the ranks reconnect and re-declare
        declare(c, "j", "pair", [0, 1], PAIR)
        with pytest.raises(InfeasibleError) as e:  # ... but not held: it is still switching
            c.hold("j", 0, "pair")
        assert e.value.field == "key" and "switching" in e.value.message
        vt.now += 0.001
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        assert not any(f.done() for f in fs)
        await vt.settle()
        assert all(f.done() for f in fs) and vt.now == pytest.approx(t0 + 1.5)
        assert c.devices["rail0"].reconfigurations == 0

    asyncio.run(second())


def test_hold_after_a_restart_keeps_a_lit_group_granted_and_refuses_a_dark_one(tmp_path, make, hello, declare,
                                                                                acquire, release):
    path, wall = tmp_path / "c.db", [50_000.0]
    config = default_config(rails=2, ports=8, delay=0.010)

    async def first():
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        for r in range(4):
            hello(c, "j", r, 4, rail0=r, rail1=r)
        declare(c, "j", "pair", [0, 1], PAIR)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        wall[0] += 1.0
        assert all(f.done() for f in fs)
        c.store.close()

    asyncio.run(first())

    async def second():
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        for r in range(4):
            hello(c, "j", r, 4, rail0=r, rail1=r)
        declare(c, "j", "pair", [0, 1], PAIR)
        declare(c, "j", "other", [2, 3], {"rail0": {2: 1}})  # needs output 1: conflicts with pair
        declare(c, "j", "dark", [2, 3], {"rail0": {2: 3, 3: 2}})
        assert c.hold("j", 0, "pair") == {"key": "pair", "holders": [0]}
        assert c.hold("j", 1, "pair") == {"key": "pair", "holders": [0, 1]}
        g = c.groups[("j", "pair")]
        assert g.status == "granted" and g.active()
        with pytest.raises(InfeasibleError) as e:
            c.hold("j", 2, "dark")
        assert e.value.field == "key" and "not lit" in e.value.message
        fo = [acquire(c, "j", r, "other") for r in (2, 3)]
        await vt.settle()
        assert not any(f.done() for f in fo)  # the held circuits are not switched under the ranks
        with pytest.raises(InfeasibleError):
            c.configure("rail0", {1: None}, job="j")
        for r in (0, 1):
            release(c, "j", r, "pair")
        await vt.settle()
        assert all(f.done() for f in fo) and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(second())


# --- random programs with admin changes interleaved -------------------------------------------------------------------


def _admin_harness(Harness):
    class AdminHarness(Harness):
        """The safety harness's ranks, plus an operator who now and then switches a job's ports (admin
        ``configure``), with both rules checked at every switch change and every grant against deadlines
        recorded here from the drivers' own completion times."""

        def __init__(self, seed: int, *, admin: float, **kw):
            super().__init__(seed, **kw)
            self.admin, self.admin_ok, self.admin_refused = admin, 0, 0
            self.deadline: dict[tuple[str, int], float] = {}
            c = self.c
            for name, driver in c.devices.items():
                def apply(changes, now, _orig=driver.apply, _d=driver, _name=name):
                    before = _d.state()
                    done = _orig(changes, now)
                    ins, outs = changed_ports(before, _d.state())
                    for p in ins | outs:  # no port a change touches may be mid-steer
                        if self.deadline.get((_name, p), 0.0) > now + 1e-9:
                            self.violations.append(f"{_name}:{p} switched at {now} mid-switch "
                                                   f"(until {self.deadline[(_name, p)]})")
                    for p in set().union(*moving_ports(before, _d.state())):  # the ports it steers
                        self.deadline[(_name, p)] = max(self.deadline.get((_name, p), 0.0), done)
                    return done
                driver.apply = apply
            inner = c._grant

            def grant(g):
                now = c.clock()
                for d, (ins, outs) in g.ports().items():
                    for p in ins | outs:
                        if self.deadline.get((d, p), 0.0) > now + 1e-9:
                            self.violations.append(f"{g.job}/{g.key} granted at {now} before {d}:{p} is lit "
                                                   f"({self.deadline[(d, p)]})")
                inner(g)
            c._grant = grant

        def step(self, rank, *, drain: bool = False) -> bool:
            if not drain and self.rng.random() < self.admin:
                self._admin()
                return True
            return super().step(rank, drain=drain)

        def _admin(self) -> None:
            job = self.rng.choice(["j", "k"])
            ports = [p for (d, p), owner in self.c.owner.items() if owner == job and d == "r0"]
            device = self.rng.choice(["r0", "r1"])
            a, b = self.rng.sample(sorted(ports), 2)
            if self.rng.random() < 0.3:
                changes = {a: None, b: None}
            elif device == "r1":  # duplex
                changes = {a: b, b: a}
            else:
                changes = {a: b}
            try:
                self.c.configure(device, changes, job=job)
                self.admin_ok += 1
            except LightrailError:
                self.admin_refused += 1  # carries traffic, still switching, or two inputs on one output
            self.vt.now += self.rng.choice([0.0, 0.001, 0.004, 0.02])

    return AdminHarness


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), admin=st.sampled_from([0.1, 0.25]), bursty=st.booleans(),
       prepare=st.sampled_from([0.0, 0.3]))
def test_random_programs_with_admin_changes_keep_both_rules(Harness, seed, admin, bursty, prepare):
    h = _admin_harness(Harness)(seed, admin=admin, bursty=bursty, prepare=prepare)
    asyncio.run(h.run())
    assert not h.violations and h.c.counters["unsafe_reconfigurations"] == 0
    assert h.admin_ok + h.admin_refused > 0


def test_random_programs_with_admin_changes_are_not_vacuous(Harness):
    """Across fixed seeds the operator's changes are both accepted and refused, and groups wait for them."""
    ok = refused = waited = 0
    for seed in range(25):
        h = _admin_harness(Harness)(seed, admin=0.25, bursty=False)
        asyncio.run(h.run())
        assert not h.violations and h.c.counters["unsafe_reconfigurations"] == 0
        ok, refused = ok + h.admin_ok, refused + h.admin_refused
        waited += sum(1 for a in h.c.applies if a["phase"] == "admin")
    assert ok > 25 and refused > 5 and waited > 25


def test_calls_from_the_admin_apis_worker_thread_schedule_on_the_loop(make, declare, acquire, job_of):
    """FastAPI runs sync routes in a worker thread: a ``bye`` or ``configure`` from there that frees or
    settles ports must not try to switch or start timers off the loop; the loop does it."""
    from lightrail.runtime.controller.protocol import Bye

    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1}})
        declare(c, "j", "B", [2, 3], {"rail0": {2: 1}})
        fa = [acquire(c, "j", r, "A") for r in (0, 1)]
        await vt.settle()
        fb = [acquire(c, "j", r, "B") for r in (2, 3)]
        await vt.settle()
        assert all(f.done() for f in fa) and not any(f.done() for f in fb)
        for rank in (0, 1):  # A's holders leave, from another thread
            await asyncio.to_thread(c.bye, Bye(op="bye", job="j", rank=rank))
        await asyncio.to_thread(c.configure, "rail1", {4: 5}, job="j")
        await vt.settle()
        assert all(f.done() for f in fb) and c.devices["rail0"].state() == {2: 1}
        assert c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_after_a_restart_ports_of_ranks_that_have_not_resumed_are_not_switched(tmp_path, make, hello, declare,
                                                                               acquire, release):
    """Groups and holders are not stored: ranks 0 and 1, inside an op on X when the controller restarted,
    may not have sent their holds when ranks 2 and 3 ask for Y, which needs X's output. Y waits for them
    (or, if they never come back, for the grace period)."""
    wall = [50_000.0]
    config = default_config(rails=2, ports=8, delay=0.010)
    x, y = {"rail0": {0: 1}}, {"rail0": {2: 1}}

    async def first(path):
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        for r in range(4):
            hello(c, "j", r, 4, rail0=r, rail1=r)
        declare(c, "j", "X", [0, 1], x)
        fs = [acquire(c, "j", r, "X") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        wall[0] += 1.0
        c.store.close()

    async def second(path, comes_back: bool):
        c, vt = make(config, Store(path, wall=lambda: wall[0]))
        t0 = vt.now
        for r in (2, 3):
            hello(c, "j", r, 4, rail0=r, rail1=r)
        declare(c, "j", "Y", [2, 3], y)
        fy = [acquire(c, "j", r, "Y") for r in (2, 3)]
        await asyncio.sleep(0)
        assert not any(f.done() for f in fy) and c.devices["rail0"].state() == {0: 1}
        with pytest.raises(InfeasibleError) as e:
            c.configure("rail0", {0: None}, job="j")
        assert e.value.field == "changes.0" and "has not resumed" in e.value.message
        if comes_back:
            for r in (0, 1):
                hello(c, "j", r, 4, rail0=r, rail1=r)
            declare(c, "j", "X", [0, 1], x)
            for r in (0, 1):
                c.hold("j", r, "X")
            release(c, "j", 0, "X")  # rank 0 resumes: still held by rank 1
            await asyncio.sleep(0)
            assert not any(f.done() for f in fy) and c.devices["rail0"].state() == {0: 1}
            release(c, "j", 1, "X")
            await vt.settle()
            switched_at = t0  # as soon as they resumed and released
        else:
            await vt.settle()
            switched_at = t0 + 30.0  # after the grace period
        assert all(f.done() for f in fy)
        assert [a["at"] for a in c.applies if a["group"] == "Y"] == [pytest.approx(switched_at)]
        assert c.devices["rail0"].state() == {2: 1} and c.counters["unsafe_reconfigurations"] == 0
        c.store.close()

    for comes_back in (True, False):
        path = tmp_path / f"c{comes_back}.db"
        asyncio.run(first(path))
        asyncio.run(second(path, comes_back))
