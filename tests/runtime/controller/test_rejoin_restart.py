"""Issue 17 item 3's PP=4 deadlock against a real controller process killed (SIGKILL) and started again:
rank 0 is inside an op on a per-op group when the controller dies, and rank 1's grant of that same round
never reached it (dropped here on purpose, as the kill dropped it in the PP=4 train-demo). After the restart
rank 0 holds the group again and rank 1's re-sent acquire (``rejoin``) must be granted inside that round;
before the fix it waited for a next round that rank 0 never starts without rank 1."""

from __future__ import annotations

import contextlib
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("httpx")  # the optional extra "service" (the admin API and its client)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.runtime.controller.test_client_restart import _admin_jobs, _register, _until, spawn  # noqa: E402,F401

from lightrail.runtime.controller.client import ControllerClient, ControllerError  # noqa: E402

PAIR = {"rail0": {0: 1, 1: 0}}


def _lose_grants(client: ControllerClient) -> tuple[list[bool], list[dict]]:
    """Make ``client`` drop acquire grants while ``dropping[0]`` (the request stays unanswered, as if the
    reply died with the controller); returns (dropping, the dropped replies)."""
    dropping, dropped = [True], []
    answered = client._answered

    def lossy(message: dict) -> None:
        if dropping[0] and message.get("granted"):
            dropped.append(message)
            return
        answered(message)

    client._answered = lossy
    return dropping, dropped


def test_a_grant_lost_in_the_kill_joins_the_round_its_peer_holds(spawn, tmp_path):  # noqa: F811
    state = tmp_path / "c.db"
    proc, info = spawn(state)
    token = _register(info, "train", 2)
    ranks = [ControllerClient("127.0.0.1", info["port"], job="train", rank=r, token=token, timeout=20,
                              heartbeat_timeout=1.0, reconnect_timeout=60) for r in range(2)]
    try:
        for r, c in enumerate(ranks):
            c.hello(2, {"rail0": r, "rail1": r})
        for c in ranks:
            c.declare("pair", [0, 1], PAIR)
        dropping, dropped = _lose_grants(ranks[1])
        with ThreadPoolExecutor(2) as pool:
            inside = pool.submit(ranks[0].acquire, "pair")
            lost = pool.submit(ranks[1].acquire, "pair")
            assert inside.result(20)["granted"]  # rank 0 is inside the op
            _until(lambda: bool(dropped), "rank 1's grant to be dropped")
            assert not lost.done()
            proc.kill()  # SIGKILL: rank 0 inside the op, rank 1's grant lost
            assert proc.wait(10) == -signal.SIGKILL
            dropping[0] = False
            proc, info2 = spawn(state, info["port"], info["admin_port"])
            reply = lost.result(20)  # before the fix: "no reply from the controller within 20 s"
        assert reply["granted"] is True and reply.get("rejoined") is True
        assert [c.restore_errors for c in ranks] == [[], []]
        assert _admin_jobs(info2)["train"]["groups"]["pair"]["holders"] == [0, 1]
        for c in ranks:
            c.release("pair")
        _until(lambda: _admin_jobs(info2)["train"]["groups"]["pair"]["status"] == "idle", "the round to end")
        with ThreadPoolExecutor(2) as pool:  # the next op: an ordinary round of the restarted controller
            replies = [f.result(20) for f in [pool.submit(c.acquire, "pair") for c in ranks]]
        assert all(r["granted"] and "rejoined" not in r for r in replies)
        for c in ranks:
            c.release("pair")
        assert [c.bye()["ok"] for c in ranks] == [True, True]
    finally:
        for c in ranks:
            c.close()


@contextlib.contextmanager
def _rank0_waiting(spawn, tmp_path):  # noqa: F811
    """Two ranks of a pair on a fresh controller, rank 0's acquire waiting (rank 1 never comes):
    (info, ranks, the acquire's request id); the clients are closed after."""
    _, info = spawn(tmp_path / "c.db")
    token = _register(info, "train", 2)
    ranks = [ControllerClient("127.0.0.1", info["port"], job="train", rank=r, token=token, timeout=20,
                              heartbeat_timeout=1.0) for r in range(2)]
    try:
        for r, c in enumerate(ranks):
            c.hello(2, {"rail0": r, "rail1": r})
        for c in ranks:
            c.declare("pair", [0, 1], PAIR)
        waiting = ranks[0].send("acquire", job="train", rank=0, key="pair")
        _until(lambda: _admin_jobs(info)["train"]["groups"]["pair"]["waiting"] == [0], "rank 0 to wait")
        yield info, ranks, waiting
    finally:
        for c in ranks:
            c.close()


def test_interrupt_answers_the_waits_and_forget_holds_drops_leases_and_stale_errors(spawn, tmp_path):  # noqa: F811
    """The public calls torch_backend's failover handling uses (it reached into the client's fields before). An
    acquire between the two fails at once: a caller that checked for news just before the push arrived would
    otherwise send a request of the failed generation after ``interrupt`` gave back the ones on the wire."""
    with _rank0_waiting(spawn, tmp_path) as (info, ranks, waiting):
        ranks[0].interrupt({"type": "Failover", "message": "rank 1 failed", "field": "rank", "fix": "rebuild"})
        with pytest.raises(ControllerError) as e:
            ranks[0].wait(waiting)
        assert e.value.kind == "Failover" and e.value.field == "rank" and "rank 1 failed" in e.value.message
        assert ranks[0].heartbeat()["ok"]  # the connection is untouched
        sent = ranks[0].requests
        with pytest.raises(ControllerError) as e:  # until the rank takes the news in, an acquire is stale at once
            ranks[0].acquire("pair", lease=True)
        assert e.value.kind == "Failover" and ranks[0].requests == sent  # nothing went out
        ranks[0].forget_holds()  # the rebuilt job: acquires again
        with ThreadPoolExecutor(2) as pool:
            replies = [f.result(20) for f in [pool.submit(c.acquire, "pair", lease=True) for c in ranks]]
        assert all("lease" in r for r in replies) and ranks[0].holds("pair")
        ranks[0].send("release", detached=True, job="train", rank=0, key="nope")  # refused: a stale error
        _until(lambda: bool(ranks[0]._failed), "the refusal to arrive")
        ranks[0].forget_holds()
        assert not ranks[0].holds("pair") and not ranks[0].enter("pair")
        assert ranks[0].heartbeat()["ok"]  # the stale error is not raised at the next wait


def test_interrupt_while_reconnecting_gives_back_the_acquire_on_the_new_connection(spawn, tmp_path):  # noqa: F811
    """The news arrives while the connection is being replaced (the heartbeat gave up on a slow controller,
    which still has the old connection's acquire waiting): interrupt's release of it waits for the new
    connection and goes out on it. Before the fix the reconnect dropped it, and the acquire stayed in the
    controller's waiters, to be granted a round this rank never releases."""
    import socket
    import threading

    with _rank0_waiting(spawn, tmp_path) as (info, ranks, waiting):
        reconnecting, gate = threading.Event(), threading.Event()
        handshake = ranks[0]._handshake

        def gated(*args):
            reconnecting.set()
            assert gate.wait(20)
            return handshake(*args)

        ranks[0]._handshake = gated
        with ranks[0]._lock:  # what the heartbeat does when the controller is slow: the controller keeps the old
            ranks[0]._up = False  # connection (and its rank's waits) until the new one's hello supersedes it
            ranks[0].sock.shutdown(socket.SHUT_RD)
        assert reconnecting.wait(20)
        ranks[0].interrupt({"type": "Failover", "message": "rank 1 failed", "field": "rank", "fix": "rebuild"})
        with pytest.raises(ControllerError):
            ranks[0].wait(waiting)
        gate.set()
        _until(lambda: ranks[0].reconnects == 1 and ranks[0].connected, "rank 0 to reconnect")
        _until(lambda: _admin_jobs(info)["train"]["groups"]["pair"]["waiting"] == [], "the acquire to be given back")
        assert ranks[0].restore_errors == []
        ranks[0].forget_holds()
        with ThreadPoolExecutor(2) as pool:  # the next round is both ranks', not one rank 0 already holds
            replies = [f.result(20) for f in [pool.submit(c.acquire, "pair") for c in ranks]]
        assert all(r["granted"] for r in replies)
