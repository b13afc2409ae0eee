"""Issue 17 item 3's PP=4 deadlock, in virtual time: after a controller restart a member restored inside an
op by ``hold`` waits for its peer, whose grant of that same round was lost in the kill; the peer's re-sent
acquire (``rejoin``) must join the restored round at once, whichever of the two reaches the restarted
controller first, and a round of the new controller must not be joined that way."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.protocol import Acquire, fast_request, parse_request
from lightrail.runtime.controller.store import Store

CONFIG = default_config(rails=2, ports=8, delay=0.010)
PAIR = {"rail0": {0: 1, 1: 0}}  # members 0 and 1 (a PP pair such as pp:2->4)
RING = {"rail0": {0: 1, 1: 2, 2: 0}}  # members 0, 1, 2


def rejoin(c, rank: int, key: str, *, again: bool = True, lease: bool = False):
    return c.acquire(Acquire(op="acquire", job="j", rank=rank, key=key, rejoin=again, lease=lease))


@pytest.fixture
def restarted(tmp_path, make, hello, declare, acquire):
    """A controller that granted ``key`` (circuits lit) and was killed, and the one started on its state file:
    ``await restarted(key, members, circuits)`` -> (controller, virtual time), the groups declared again."""

    runs = itertools.count()

    async def start(key: str, members, circuits):
        path, wall = tmp_path / f"{key}-{next(runs)}.db", [50_000.0]

        async def first():
            c, vt = make(CONFIG, Store(path, wall=lambda: wall[0]))
            for r in range(4):
                hello(c, "j", r, 4, rail0=r, rail1=r)
            declare(c, "j", key, members, circuits)
            fs = [acquire(c, "j", r, key) for r in members]
            await vt.settle()
            assert all(f.done() for f in fs)
            wall[0] += 1.0
            c.store.close()  # the kill: nothing else is written

        await first()
        c, vt = make(CONFIG, Store(path, wall=lambda: wall[0]))
        for r in range(4):
            hello(c, "j", r, 4, rail0=r, rail1=r)
        declare(c, "j", key, members, circuits)
        return c, vt

    return start


def test_a_rejoining_acquire_joins_the_round_a_peer_restored_by_hold(restarted, release, acquire):
    """The PP=4 deadlock: rank 0 is inside the op (hold), rank 1's grant was lost; its re-sent acquire is
    granted at once (a plain acquire would wait for a next round rank 0 never starts until rank 1 ran)."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        c.hold("j", 0, "pair")
        f = rejoin(c, 1, "pair")
        assert f is not None and f.done() and f.result() == {"rejoined": True}
        g = c.groups[("j", "pair")]
        assert g.holders == {0, 1} and g.status == "granted" and c.counters["rejoins"] == 1
        for r in (0, 1):
            release(c, "j", r, "pair")
        assert g.status == "idle" and g.restored is None  # the restored round is over
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]  # the next op: a round of this controller
        await vt.settle()
        assert all(f.done() and f.result() is None for f in fs)
        assert c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_without_the_flag_the_same_acquire_waits_for_the_next_round(restarted):
    """What the client did before the fix: the round rank 0 is inside never grants rank 1 (the deadlock)."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        c.hold("j", 0, "pair")
        f = rejoin(c, 1, "pair", again=False)
        await vt.settle()
        assert not f.done() and c.groups[("j", "pair")].holders == {0}

    asyncio.run(run())


def test_a_rejoining_acquire_that_arrives_before_the_hold_is_granted_by_it(restarted, release):
    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        f = rejoin(c, 1, "pair")
        await vt.settle()
        assert not f.done()  # nothing restored yet: it waits as an acquire does
        c.hold("j", 0, "pair")
        assert f.done() and f.result() == {"rejoined": True}
        assert c.groups[("j", "pair")].holders == {0, 1}
        assert c.groups[("j", "pair")].rejoins == {}

    asyncio.run(run())


def test_a_member_already_in_the_restored_round_waits_for_the_next_one(restarted, release, acquire):
    """Rank 0 held the round and released: its next acquire (even flagged) is for the next op, not this
    round (else it would run an op ahead of its peer): it waits for the barrier."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        c.hold("j", 0, "pair")
        assert rejoin(c, 1, "pair").done()
        release(c, "j", 0, "pair")
        again = rejoin(c, 0, "pair")
        await vt.settle()
        assert not again.done()
        release(c, "j", 1, "pair")  # the restored round ends
        await vt.settle()
        assert not again.done()  # a barrier: rank 1 must ask for the next op too
        f1 = acquire(c, "j", 1, "pair")
        await vt.settle()
        assert again.done() and f1.done() and again.result() is None

    asyncio.run(run())


def test_a_rejoining_acquire_in_a_round_of_this_controller_is_an_acquire(restarted, release, acquire):
    """No hold restored anything: the flag changes nothing (the barrier, a normal grant)."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        f0 = rejoin(c, 0, "pair")
        await vt.settle()
        assert not f0.done()
        f1 = acquire(c, "j", 1, "pair")
        await vt.settle()
        assert f0.done() and f1.done() and f0.result() is None and c.counters["rejoins"] == 0
        release(c, "j", 1, "pair")
        late = rejoin(c, 1, "pair")  # granted normally, rank 1 released: no restored round to join
        await vt.settle()
        assert not late.done()

    asyncio.run(run())


def test_a_rejoining_holder_keeps_the_circuits_lit_until_it_releases(restarted, release, acquire, declare):
    """The joined rank holds the group: a conflicting group is not switched in until it releases too."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        declare(c, "j", "other", [2, 3], {"rail0": {2: 1}})  # needs output 1
        c.hold("j", 0, "pair")
        assert rejoin(c, 1, "pair").done()
        fo = [acquire(c, "j", r, "other") for r in (2, 3)]
        release(c, "j", 0, "pair")
        await vt.settle()
        assert not any(f.done() for f in fo) and c.devices["rail0"].state().get(1) == 0
        release(c, "j", 1, "pair")
        await vt.settle()
        assert all(f.done() for f in fo) and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


@pytest.mark.parametrize("held", [{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}])
def test_every_arrival_order_of_holds_and_rejoins_grants_the_whole_ring(restarted, release, held):
    """Brute force over a 3-member ring: some members hold, the others re-send their acquire; in any order
    of arrival every member ends up a holder of the one restored round, and it ends after the releases."""
    members = [0, 1, 2]
    for order in itertools.permutations(members):

        async def run(order=order):
            c, vt = await restarted("ring", members, RING)
            futures = {}
            for r in order:
                if r in held:
                    c.hold("j", r, "ring")
                else:
                    futures[r] = rejoin(c, r, "ring")
                await vt.settle()
            g = c.groups[("j", "ring")]
            assert g.holders == set(members), order
            assert all(f.done() and f.result() == {"rejoined": True} for f in futures.values()), order
            assert c.counters["rejoins"] == len(members) - len(held)
            for r in members:
                release(c, "j", r, "ring")
            assert g.status == "idle" and not g.holders and g.restored is None
            c.store.close()

        asyncio.run(run())


@pytest.mark.parametrize("compact", [True, False])
def test_the_flag_survives_both_parsers(compact):
    """The server's fast path and the models both carry ``rejoin`` (dropping it would reopen the deadlock;
    refusing it would fail every re-sent acquire)."""
    message = {"id": 3, "op": "acquire", "job": "j", "rank": 1, "key": "pp:2->4", "rejoin": True}
    line = (json.dumps(message, separators=(",", ":")) if compact else json.dumps(message)).encode()
    fast, model = fast_request(line), parse_request(line)
    assert fast is not None and fast.rejoin is True and model.rejoin is True
    assert parse_request(line.replace(b"true", b"false")).rejoin is False
    assert fast_request(line.replace(b"true", b"1")) is None  # not a bool: the models name the field
