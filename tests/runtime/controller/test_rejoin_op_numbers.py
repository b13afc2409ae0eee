"""Issue 17 item 3, the op-number gap: after a controller restart a re-sent acquire is flagged ``rejoin``, but
it may already be for the *next* op (the rank finished op k, and its release and its acquire for op k+1 were
both lost in the kill). Joining the round a peer restored by ``hold`` for op k would run op k+1 one op early:
the peer's release would leave the round granted to the early rank and the peer's own acquire for op k+1
would wait for a round that never comes. With ``op_no`` on acquire and hold, such an acquire waits for the
next round; without numbers (an older client) the join happens as before; the same op still joins at once."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.runtime.controller.test_rejoin_core import PAIR, RING, restarted  # noqa: F401

from lightrail.runtime.controller.client import ControllerClient, ControllerError
from lightrail.runtime.controller.protocol import Acquire, Hold, fast_request, parse_request


def hold(c, rank: int, key: str, op_no: int | None):
    return c.hold(Hold(op="hold", job="j", rank=rank, key=key, op_no=op_no))


def rejoin(c, rank: int, key: str, op_no: int | None):
    """A re-sent acquire, as the server hands it over (the fast path's parse of the client's line)."""
    line = json.dumps({"id": 9, "op": "acquire", "job": "j", "rank": rank, "key": key, "rejoin": True,
                       **({} if op_no is None else {"op_no": op_no})}, separators=(",", ":")).encode()
    m = fast_request(line)
    assert m is not None and m.op_no == op_no == parse_request(line).op_no
    return c.acquire(m)


@pytest.mark.parametrize("hold_first", [True, False])
def test_an_acquire_for_the_next_op_waits_and_both_ranks_get_that_op_together(restarted, release,  # noqa: F811
                                                                              hold_first):
    """Rank 0 is inside op 5 (hold); rank 1 finished op 5 and its acquire for op 6 is re-sent, before or after
    the hold arrives. It must not join op 5's round: rank 0's release ends it, and rank 0's acquire for op 6
    and rank 1's are granted together, as one ordinary round of the restarted controller."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        g = c.groups[("j", "pair")]
        if hold_first:
            hold(c, 0, "pair", 5)
        release(c, "j", 1, "pair")  # rank 1's re-sent release of op 5 (nothing of it here to release)
        early = rejoin(c, 1, "pair", 6)
        if not hold_first:
            hold(c, 0, "pair", 5)
        await vt.settle()
        assert not early.done() and g.holders == {0} and c.counters["rejoins"] == 0
        release(c, "j", 0, "pair")  # rank 0's op 5 completes: the restored round ends
        await vt.settle()
        assert g.status == "idle" and g.restored is None and not g.holders
        assert not early.done()  # still a barrier: rank 0 must ask for op 6 too
        late = c.acquire(Acquire(op="acquire", job="j", rank=0, key="pair", op_no=6))
        await vt.settle()
        assert early.done() and late.done() and early.result() is None and late.result() is None
        assert g.holders == {0, 1} and c.counters["rejoins"] == 0
        for r in (0, 1):
            release(c, "j", r, "pair")
        assert g.status == "idle" and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


@pytest.mark.parametrize("hold_no, acquire_no", [(None, None), (5, None), (None, 6)])
def test_without_both_numbers_the_rejoin_joins_as_before(restarted, hold_no, acquire_no):  # noqa: F811
    """An older client on either side (no ``op_no``): the restored round cannot tell the ops apart, so the
    re-sent acquire joins it at once, as before op numbers (the PP=4 deadlock fix stays)."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        hold(c, 0, "pair", hold_no)
        f = rejoin(c, 1, "pair", acquire_no)
        assert f.done() and f.result() == {"rejoined": True}
        assert c.groups[("j", "pair")].holders == {0, 1} and c.counters["rejoins"] == 1

    asyncio.run(run())


@pytest.mark.parametrize("hold_first", [True, False])
def test_an_acquire_for_the_op_the_peer_is_inside_joins_at_once(restarted, release, hold_first):  # noqa: F811
    """Rank 1's grant of op 5 was lost in the kill: its re-sent acquire carries 5, the number rank 0 holds."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        if hold_first:
            hold(c, 0, "pair", 5)
        f = rejoin(c, 1, "pair", 5)
        if not hold_first:
            assert not f.done()  # nothing restored yet
            hold(c, 0, "pair", 5)
        assert f.done() and f.result() == {"rejoined": True}
        g = c.groups[("j", "pair")]
        assert g.holders == {0, 1} and g.rejoins == {} and c.counters["rejoins"] == 1
        for r in (0, 1):
            release(c, "j", r, "pair")
        assert g.status == "idle" and g.restored is None

    asyncio.run(run())


def test_holds_an_op_apart_let_in_either_op_and_no_later_one(restarted, release):  # noqa: F811
    """Members of a lease may be an op apart when the controller dies (rank 0 inside op 5, rank 1 inside op 6):
    the restored round is in both, so a re-sent acquire for either joins (a holder may be waiting for it) and
    one for op 7 waits for the next round."""

    async def run():
        c, vt = await restarted("ring", [0, 1, 2], RING)
        hold(c, 0, "ring", 5)
        hold(c, 1, "ring", 6)
        g = c.groups[("j", "ring")]
        assert g.restored_ops == {5, 6}
        ahead = rejoin(c, 2, "ring", 7)
        await vt.settle()
        assert not ahead.done() and g.holders == {0, 1}
        behind = rejoin(c, 2, "ring", 6)  # replaces the wait (the client's own re-send has one number)
        assert behind.done() and behind.result() == {"rejoined": True} and g.holders == {0, 1, 2}

    asyncio.run(run())


def test_the_client_numbers_its_ops_per_key_and_keeps_them_across_a_reconnect(scripted, until):  # noqa: F811
    """Acquires count per key; ops entered under a lease count; a re-sent acquire, a hold after the reconnect
    and the hold standing in for a lease acquire carry the number of their op; a refused acquire gives its
    number back (the op did not start); the next op after the reconnect goes on counting."""
    refused = threading.Event()

    def answer(m):
        if m["op"] == "acquire" and m["key"] == "b" and len(ctl.lines) == 1 and m.get("op_no") == 2:
            return None  # rank 1's acquire for its second op on "b" is lost in the kill
        if m["op"] == "acquire" and m["key"] == "bad" and not refused.is_set():
            refused.set()
            return {"id": m["id"], "ok": False, "error": {"type": "ScenarioError", "message": "unknown group",
                                                          "field": "key"}}
        if m["op"] == "acquire" and m["key"] == "lease" and len(ctl.lines) == 1:
            return {"id": m["id"], "ok": True, "granted": True, "lease": 7}
        return {"id": m["id"], "ok": True, "granted": True} if m["op"] == "acquire" else {"id": m["id"], "ok": True}

    def numbers(conn: int, op: str, key: str) -> list:
        return [m.get("op_no", "absent") for m in ctl.messages(conn) if m["op"] == op and m["key"] == key]

    ctl = scripted(answer)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=1, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 1})
        for key in ("a", "b", "lease", "bad"):
            c.declare(key, [0, 1], {"rail0": {0: 1, 1: 0}})
        c.acquire("a")
        c.release("a")
        c.acquire("a")  # inside op 2 of "a" when the controller dies
        c.acquire("b")
        c.release("b")
        c.acquire("lease", lease=True)  # op 1 of "lease", granted as a lease
        c.leave("lease")
        assert c.enter("lease")  # op 2, under the lease: no request
        c.leave("lease")
        assert c.enter("lease")  # op 3: inside it when the controller dies
        with pytest.raises(ControllerError):
            c.acquire("bad")
        c.acquire("bad")  # the refused op never started: this is op 1 again
        c.release("bad")
        with ThreadPoolExecutor(1) as pool:
            lost = pool.submit(c.acquire, "b")
            until(lambda: numbers(0, "acquire", "b") == [1, 2], "the acquire of op 2 of 'b'")
            ctl.drop()
            assert lost.result(20)["granted"] is True
        assert numbers(0, "acquire", "a") == [1, 2] and numbers(0, "acquire", "lease") == [1]
        assert numbers(0, "acquire", "bad") == [1, 1]
        assert numbers(1, "hold", "a") == [2] and numbers(1, "hold", "lease") == [3]  # the ops they are inside
        resent = [m for m in ctl.messages(1) if m["op"] == "acquire"]
        assert [(m["key"], m["op_no"], m["rejoin"]) for m in resent] == [("b", 2, True)]  # same number
        c.release("b")
        c.release("a")
        c.acquire("a")  # the next op after the reconnect
        c.leave("lease")  # the held lease op ends (its release goes out)
        c.acquire("lease", lease=True)  # after a reconnect: a hold in its place, with the acquire's number
        assert numbers(1, "acquire", "a") == [3] and numbers(1, "hold", "lease") == [3, 4]
        assert "rejoin" not in [m for m in ctl.messages(1) if m["op"] == "acquire"][-1]
    finally:
        c.close()
