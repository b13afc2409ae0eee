"""Issue 17 item 3, leases after a restart: a rank's lease acquire goes out as a ``first`` hold (in place of the
acquire) until a round of the restarted controller grants the group, because a peer may be inside the op already.
Granted on lit circuits alone, every op's hold was granted (no barrier, never a lease again) for the rest of the
job. A first hold now joins only a round restored by hold for the same op; otherwise the answer is ``held: false``
and the rank acquires, so the job's next op is an ordinary barrier round and its leases come back."""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("httpx")  # the optional extra "service" (the admin API and its client)
from tests.runtime.controller.test_client_restart import _register, _until, spawn  # noqa: E402,F401
from tests.runtime.controller.test_failover_after_restart import _hold_requests, _metric  # noqa: E402
from tests.runtime.controller.test_rejoin_core import PAIR, RING, restarted  # noqa: E402,F401

from lightrail.runtime.controller.client import ControllerClient  # noqa: E402
from lightrail.runtime.controller.core import Superseded  # noqa: E402
from lightrail.runtime.controller.protocol import Acquire, Hold  # noqa: E402


def hold(c, rank: int, key: str, op_no: int, *, first: bool = False) -> dict:
    return c.hold(Hold(op="hold", job="j", rank=rank, key=key, op_no=op_no, first=first))


def lease_acquire(c, rank: int, key: str, op_no: int):
    return c.acquire(Acquire(op="acquire", job="j", rank=rank, key=key, lease=True, op_no=op_no))


def test_with_nobody_inside_a_first_hold_is_not_held_and_the_acquires_get_a_lease(restarted,  # noqa: F811
                                                                                        release):
    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        g = c.groups[("j", "pair")]
        for rank in (0, 1):  # circuits lit, nobody inside an op: before, both were granted, each its own held op
            assert hold(c, rank, "pair", 1, first=True) == {"held": False}
        assert not g.holders and g.status == "idle"
        futures = [lease_acquire(c, r, "pair", 1) for r in (0, 1)]  # what the client sends on that answer
        await vt.settle()
        assert all(f.done() and "lease" in f.result() for f in futures) and g.lease is not None

    asyncio.run(run())


@pytest.mark.parametrize("members,circuits,inside", [([0, 1], PAIR, {0: 5}), ([0, 1, 2], RING, {0: 6, 1: 5})])
def test_a_first_hold_joins_the_op_a_peer_is_inside_and_no_other(restarted, release,  # noqa: F811
                                                                      members, circuits, inside):
    """The ranks in ``inside`` reconnect inside an op (their holds restore the round; a lease's members may be
    an op apart). The last member's first hold, sent before theirs, is not held and its acquire waits (an acquire
    does not join a restored round); its next try joins at once, and so for each op a peer is inside, even after
    it held an earlier op of that round (the peer inside the later op waits for its part). For an op nobody is
    inside, the hold is not held: joining would run it early."""

    async def run():
        c, vt = await restarted("ring", members, circuits)
        g = c.groups[("j", "ring")]
        last, ops = members[-1], sorted(set(inside.values()))
        assert hold(c, last, "ring", ops[0], first=True) == {"held": False}  # before the peers' holds: no round yet
        waiting = lease_acquire(c, last, "ring", ops[0])  # what the client sends on that answer
        for rank, op in inside.items():
            assert hold(c, rank, "ring", op)["holders"] == sorted(g.holders)
        await vt.settle()
        assert not waiting.done() and last not in g.holders
        assert hold(c, last, "ring", ops[-1] + 1, first=True) == {"held": False}  # nobody is inside that op
        for op in ops:  # the client's next tries of the hold, then its ops in order
            hold(c, last, "ring", op, first=True)
            assert last in g.holders and g.restored is not None
            if op != ops[-1]:
                release(c, "j", last, "ring")
        assert isinstance(waiting.exception(), Superseded)  # the joining hold answered the acquire
        for rank in members:
            release(c, "j", rank, "ring")
        await vt.settle()
        assert g.status == "idle" and g.restored is None and not g.holders
        futures = [lease_acquire(c, r, "ring", 8) for r in members]  # the next op: a barrier round, a lease
        await vt.settle()
        assert all(f.done() and "lease" in f.result() for f in futures)

    asyncio.run(run())


def test_a_hold_from_inside_an_op_is_still_granted_on_lit_circuits(restarted, release):  # noqa: F811
    """The restore hold (no ``first``) keeps its rule: the rank is inside the op, so its circuits must stay up."""

    async def run():
        c, vt = await restarted("pair", [0, 1], PAIR)
        assert hold(c, 0, "pair", 3)["holders"] == [0]
        assert c.groups[("j", "pair")].restored == {0}

    asyncio.run(run())


def test_after_a_restart_with_nobody_inside_the_ranks_get_their_lease_back(spawn, tmp_path):  # noqa: F811
    """End to end, as torch_backend runs a leased phase (enter, else acquire with lease; leave after the op):
    after a controller kill between ops, the first op's holds are not held, its acquires are a barrier round
    that grants a lease, and the next ops run under it with no request. Before, every op after the restart was a
    hold and a release (2 requests per op per rank for the rest of the job)."""
    proc, info = spawn(tmp_path / "c.db")
    token = _register(info, "train", 2)
    ranks = [ControllerClient("127.0.0.1", info["port"], job="train", rank=r, token=token, timeout=20,
                              heartbeat_timeout=1.0, reconnect_timeout=60) for r in range(2)]

    def op(c: ControllerClient) -> None:
        if c.enter("dp"):
            c.leave("dp")
            return
        reply = c.acquire("dp", lease=True)
        if "lease" in reply:
            c.leave("dp")
        else:
            c.release("dp")

    def ops(n: int) -> list[int]:
        """Requests per rank (the client's count: an acquire sent as a hold first is one) for ``n`` ops of both."""
        before = [c.requests for c in ranks]
        with ThreadPoolExecutor(2) as pool:
            for _ in range(n):
                for f in [pool.submit(op, c) for c in ranks]:
                    f.result(20)
        return [c.requests - b for c, b in zip(ranks, before, strict=True)]

    try:
        for r, c in enumerate(ranks):
            c.hello(2, {"rail0": r, "rail1": r})
        for c in ranks:
            c.declare("dp", [0, 1], PAIR)
        assert ops(5) == [1, 1]  # one acquire, then the lease
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        proc, info = spawn(tmp_path / "c.db", info["port"], info["admin_port"])
        _until(lambda: all(c.reconnects == 1 and c.connected for c in ranks), "both ranks to reconnect")
        # the first op: one acquire (on the wire, a hold answered held: false before it), then the lease;
        # before: [10, 10]. The answered holds are no errors (an operator's alert counts those).
        assert ops(5) == [1, 1]
        assert _hold_requests(info) >= 2 and _metric(info, "lightrail_request_errors_total") == 0
        assert all(c.holds("dp") and not c._resync for c in ranks)
        assert [c.restore_errors for c in ranks] == [[], []]
    finally:
        for c in ranks:
            c.close()
