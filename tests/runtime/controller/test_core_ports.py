"""Dead ports and the cost of a request (issue 17): a port the operator marks failed refuses every
group using it, plainly and durably; and another tenant's groups do not add to an acquire's work
(groups looked at, counted by the controller: no wall-clock assertion)."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.errors import InfeasibleError
from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.core import GroupState
from lightrail.runtime.controller.store import Store

PAIR = {"rail0": {0: 1, 1: 0}}


def test_a_dead_port_refuses_its_groups_plainly_and_durably(tmp_path, make, declare, acquire, release, job_of):
    path = tmp_path / "c.db"

    async def run():
        c, vt = make(None, Store(path))
        pushed: list = []
        c.notify = lambda job, rank, message: pushed.append((job, rank, message))
        job_of(c, world=3)
        declare(c, "j", "pair", [0, 1], PAIR)
        declare(c, "j", "other", [0, 2], {"rail0": {0: 2, 2: 0}})
        f0 = acquire(c, "j", 0, "pair")
        reply = c.port_failed("rail0", 1)
        assert reply == {"device": "rail0", "port": 1, "dead": True, "groups": ["j/pair"]}
        e = f0.exception()  # the waiter is woken with the reason
        assert isinstance(e, InfeasibleError) and e.field == "circuits.rail0" and "port 1" in e.message
        assert e.fix == "re-plan without it"
        assert sorted(r for _, r, _ in pushed) == [0, 1, 2]
        assert pushed[0][2] == {"op": "port_failed", "job": "j", "device": "rail0", "port": 1}
        for rank in (0, 1):
            with pytest.raises(InfeasibleError) as e:
                acquire(c, "j", rank, "pair")
            assert e.value.field == "circuits.rail0"
        assert not c.groups[("j", "pair")].intents
        with pytest.raises(InfeasibleError) as e:
            c.hold("j", 0, "pair")
        assert "dead" in e.value.message
        with pytest.raises(InfeasibleError) as e:
            c.configure("rail0", {0: 1}, job="j")
        assert e.value.field == "changes.0" and "dead" in e.value.message
        fs = [acquire(c, "j", r, "other") for r in (0, 2)]  # a plan without the dead port works
        await vt.settle()
        assert all(f.done() and not f.exception() for f in fs)
        for r in (0, 2):
            release(c, "j", r, "other")
        c.store.close()

    asyncio.run(run())

    async def restarted():
        c, vt = make(None, Store(path))
        assert c.ports_view()["rail0"]["dead"] == [1]
        for r in range(3):
            c.connected.add(("j", r))
        declare(c, "j", "pair", [0, 1], PAIR)
        with pytest.raises(InfeasibleError):
            acquire(c, "j", 0, "pair")
        assert c.port_repaired("rail0", 1) == {"device": "rail0", "port": 1, "dead": False}
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() and not f.exception() for f in fs)
        assert Store(path).dead_ports() == set()

    asyncio.run(restarted())


def test_another_tenants_groups_do_not_add_to_an_acquires_work(make, hello, declare, acquire, release):
    """Job "a" runs rounds of an 8-rank ring while job "b" declares more and more groups (some with members
    waiting): the groups the controller looks at per round of "a" (its ``visits``) stay the same, and none
    of b's groups is even touched (every attribute access on them is counted)."""
    config = default_config(rails=2, ports=64, delay=0.010)
    touched = [0]

    class Counted(GroupState):
        def __getattribute__(self, name):
            touched[0] += 1
            return super().__getattribute__(name)

    async def run():
        c, vt = make(config)
        for r in range(8):
            hello(c, "a", r, 8, rail0=r, rail1=r)
        for r in range(16):
            hello(c, "b", r, 16, rail0=8 + r, rail1=8 + r)
        declare(c, "a", "ring", range(8), {"rail0": {r: (r + 1) % 8 for r in range(8)}})

        async def round_of_a() -> tuple[int, int]:
            visits, touches = c.visits, touched[0]
            fs = [acquire(c, "a", r, "ring") for r in range(8)]
            await vt.settle()
            assert all(f.done() for f in fs)
            for r in range(8):
                release(c, "a", r, "ring")
            await vt.settle()
            return c.visits - visits, touched[0] - touches

        await round_of_a()  # lights the ring
        costs, b_groups = [], 0
        for more in (100, 1000, 4000):
            for n in range(b_groups, b_groups + more):
                i, o = n % 16, (n * 7 + 3) % 16
                o = o if o != i else (o + 1) % 16
                declare(c, "b", f"g{n}", sorted({i, o}), {"rail0": {8 + i: 8 + o}, "rail1": {8 + o: 8 + i}})
            if not b_groups:
                for r in range(0, 16, 2):  # half of b's ranks wait in a group (its barrier is not complete)
                    g = next(g for g in c.job_groups["b"].values() if r in g.members and len(g.members) == 2)
                    acquire(c, "b", r, g.key)
            b_groups += more
            for g in c.job_groups["b"].values():
                g.__class__ = Counted
            costs.append(await round_of_a())
        assert len(c.job_groups["b"]) == 5100
        assert costs[0] == costs[1] == costs[2] and costs[0][1] == 0, costs
        c.jobs_view()  # a scan of every group (what each request did before issue 17) is counted
        assert touched[0] >= 5100

    asyncio.run(run())
