"""Leases: circuits held across ops with no request, revoked when another group needs the ports, freed
only once no holder is left and every member ran the same ops; then the same under random programs."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.errors import ScenarioError
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import Ack, Bye


def ack(c: Controller, job: str, rank: int, key: str, lease: int, ops: int, inside: bool = False) -> dict:
    return c.ack(Ack(op="ack", job=job, rank=rank, key=key, lease=lease, ops=ops, inside=inside))


def test_a_lease_holds_across_ops_until_another_group_needs_its_ports(acquire, release, record_is_safe, lease_pair):
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


def test_a_holder_inside_an_op_releases_when_it_completes(acquire, release, lease_pair, lease_a):
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


def test_a_member_behind_runs_its_remaining_ops_before_the_ports_are_freed(acquire, release, lease_pair, lease_a):
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


def test_a_peer_that_acked_before_entering_the_op_another_member_waits_in_rejoins_it(acquire, release, lease_pair,
                                                                                     lease_a):
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


def test_a_lease_is_granted_only_if_every_member_asked_for_one_and_ends_only_by_revoke(acquire, release, lease_pair,
                                                                                       lease_a):
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


def test_a_disconnected_ranks_leases_vanish(acquire, lease_pair, lease_a):
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


# --- leases under random interleavings --------------------------------------------------------------------------------


@pytest.mark.parametrize(("bursty", "prepare"), [(False, 0.0), (True, 0.3)], ids=["settled", "bursty-prepare"])
def test_leases_random_programs_safe_and_live(bursty, prepare, LeaseHarness):
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
