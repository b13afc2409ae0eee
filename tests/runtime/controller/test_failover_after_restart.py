"""Issue 17, kills + spares: a failover that follows a controller restart hung the train-demo (a survivor waited
for ever). After the restart a rank's lease acquires go out as ``hold`` first (see the client's module doc). One
sent just before the rank read the ``failover`` push reached the controller after its reset of the job's groups,
was granted there (the circuits were lit) and made the rank a holder of the rebuilt job's first round, which it
never releases: its peer's acquire of that group waited for ever. Two fixes, each enough: the client answers the
caller with the push's news and sends a ``release`` after every acquire and hold still on the wire when the push
arrives; and the controller grants such a hold (``first``: in place of an acquire) only to join a round restored
by hold for the same op, which a reset job has none of."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("httpx")  # the optional extra "service" (the admin API and its client)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.runtime.controller.test_client_restart import _admin, _admin_jobs, _until, spawn  # noqa: E402,F401

from lightrail.runtime.controller.client import ControllerClient, ControllerError  # noqa: E402

PAIR = {"rail0": {0: 1, 1: 0}}
MOVED = {"rail0": {0: 2, 2: 0}}  # rank 1's port 1 moved to the spare's port 2


def _metric(info: dict, series: str) -> float:
    """One series of the controller's /metrics (0 while it has no sample)."""
    with _admin(info) as admin:
        text = admin.get("/metrics").text
    return next((float(line[len(series) + 1:]) for line in text.splitlines() if line.startswith(series + " ")), 0.0)


def _hold_requests(info: dict) -> float:
    """Hold requests the controller handled (refused ones too)."""
    return _metric(info, 'lightrail_request_duration_seconds_count{op="hold"}')


def _interrupt(client: ControllerClient, message: dict) -> None:
    """What torch_backend does on a ``failover`` push: fail the waits with its news."""
    client.interrupt({"type": "Failover", "message": f"rank {message['rank']} failed", "field": "rank",
                      "fix": "rebuild the process groups and resume from the checkpoint"})


def test_a_hold_sent_before_the_failover_push_does_not_hold_the_rebuilt_round(spawn, tmp_path):  # noqa: F811
    state = tmp_path / "c.db"
    proc, info = spawn(state)
    with _admin(info) as admin:
        reply = admin.post("/jobs", json={"job": "train", "world": 2, "spares": 1})
        assert reply.status_code == 200, reply.text
        token = reply.json()["token"]
    clients: list[ControllerClient] = []

    def client(rank: int) -> ControllerClient:
        c = ControllerClient("127.0.0.1", info["port"], job="train", rank=rank, token=token, timeout=20,
                             heartbeat_timeout=1.0, reconnect_timeout=60,
                             on_failover=lambda message: _interrupt(c, message))
        clients.append(c)
        return c

    r0, r1, spare = client(0), client(1), client(2)
    try:
        r0.hello(2, {"rail0": 0, "rail1": 0})
        r1.hello(2, {"rail0": 1, "rail1": 1})
        spare.hello(2, {"rail0": 2, "rail1": 2}, spare=True)
        for c in (r0, r1):
            c.declare("pair", [0, 1], PAIR)
        with ThreadPoolExecutor(2) as pool:  # a lease, given up between ops: forgotten by the restart
            assert all("lease" in f.result(20) for f in [pool.submit(c.acquire, "pair", lease=True) for c in (r0, r1)])
        assert not r0.leave("pair") and not r1.leave("pair")
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        proc, info = spawn(state, info["port"], info["admin_port"])
        _until(lambda: all(c.reconnects == 1 and c.connected for c in clients), "every client to reconnect")
        for c in (r0, r1):  # each rank resumes (a release of nothing), so the failover may rewire its ports at once;
            c.release("pair")  # their lease acquires are still holds first

        # rank 0 reads the failover push only once its next lease acquire (a hold, since the restart) is on the wire
        arrived, go = threading.Event(), threading.Event()
        pushed = r0._pushed

        def late(message: dict) -> None:
            if message.get("op") == "failover":
                arrived.set()
                go.wait(20)
            pushed(message)

        r0._pushed = late
        r1.close()  # gone without bye: the spare takes rank 1 over, the job's groups start a fresh round
        assert arrived.wait(20)
        time.sleep(0.05)  # past the rewire's 5 ms switch: lit, so only the rule refuses the hold (not timing)
        before = _hold_requests(info)
        with ThreadPoolExecutor(1) as pool:
            stale = pool.submit(r0.acquire, "pair", lease=True)
            _until(lambda: _hold_requests(info) > before, "rank 0's hold to reach the controller")
            # before either fix: granted (a holder of the dead generation's round); now refused, no round to join
            assert _admin_jobs(info)["train"]["groups"]["pair"]["holders"] == []
            go.set()
            with pytest.raises(ControllerError) as e:  # the push's news, not the refusal's acquire
                stale.result(20)
        assert e.value.kind == "Failover" and "rank 1 failed" in e.value.message
        group = _admin_jobs(info)["train"]["groups"]["pair"]
        assert group["holders"] == [] and group["waiting"] == []  # nothing of rank 0's stale op is left

        # the rebuilt job's first op: both members are granted together (before the fix rank 0 was granted at once
        # as the stale holder and the spare waited for a next round that never came)
        r0.forget_holds()
        spare.forget_holds()
        spare.rank = 1
        spare.hello(2, {"rail0": 2, "rail1": 2})
        for c in (r0, spare):
            c.declare("pair", [0, 1], MOVED)
        with ThreadPoolExecutor(2) as pool:
            replies = [f.result(20) for f in [pool.submit(c.acquire, "pair") for c in (r0, spare)]]
        assert all(r["granted"] and "held" not in r for r in replies)
        assert _admin_jobs(info)["train"]["groups"]["pair"]["holders"] == [0, 1]
        for c in (r0, spare):
            c.release("pair")
        assert [c.restore_errors for c in (r0, spare)] == [[], []]
    finally:
        for c in clients:
            c.close()
