"""The rank's client against a real controller process that is killed (SIGKILL) and started again on the same
state file and ports, or frozen (SIGSTOP): ranks inside an op hold their group again, a blocked acquire is
answered by the new controller, and a frozen one ends the waits in one line within the client's bound."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")  # the optional extra "service" (the admin API and its client)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.runtime.controller.conftest import NATIVE_FRONTEND  # noqa: E402

from lightrail.errors import InfeasibleError  # noqa: E402
from lightrail.runtime.controller.client import ControllerClient  # noqa: E402

OPERATOR = secrets.token_urlsafe(24)


@pytest.fixture
def spawn(spawn):
    """conftest's ``spawn`` with this module's operator token (a restart keeps it) and, for a restart, the
    first start's ports: ``spawn(state, port=0, admin_port=0)``."""
    def start(state: Path, port: int = 0, admin_port: int = 0) -> tuple[subprocess.Popen, dict]:
        return spawn(state, port=port, admin_port=admin_port,
                     env={**os.environ, "LIGHTRAIL_OPERATOR_TOKEN": OPERATOR})
    return start


def _admin(info: dict) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{info['admin_port']}", timeout=10,
                        headers={"Authorization": f"Bearer {OPERATOR}"})


def _register(info: dict, job: str, world: int) -> str:
    with _admin(info) as admin:
        reply = admin.post("/jobs", json={"job": job, "world": world})
        assert reply.status_code == 200, reply.text
        return reply.json()["token"]


def _until(check, what, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.02)


@pytest.mark.parametrize("frontend", ["loop", NATIVE_FRONTEND])
def test_ranks_survive_a_controller_restart_holding_and_waiting(spawn, tmp_path):
    state = tmp_path / "c.db"
    proc, info = spawn(state)
    token = _register(info, "train", 4)
    ranks = [ControllerClient("127.0.0.1", info["port"], job="train", rank=r, token=token, timeout=60,
                              heartbeat_timeout=1.0, reconnect_timeout=60) for r in range(4)]
    try:
        for r, c in enumerate(ranks):
            c.hello(4, {"rail0": r, "rail1": r})
        for c in ranks[:2]:
            c.declare("pair", [0, 1], {"rail0": {0: 1, 1: 0}})
        for c in ranks[2:]:
            c.declare("quad", [2, 3], {"rail1": {2: 3, 3: 2}})
        with ThreadPoolExecutor(2) as pool:
            assert all(f.result(30)["granted"] for f in [pool.submit(c.acquire, "pair") for c in ranks[:2]])
        waiting = ranks[2].send("acquire", job="train", rank=2, key="quad")  # rank 3 is not there yet
        _until(lambda: _admin_jobs(info)["train"]["groups"]["quad"]["waiting"] == [2], "rank 2 to wait")
        proc.kill()  # SIGKILL: ranks 0 and 1 inside an op on "pair", rank 2 blocked in an acquire
        assert proc.wait(10) == -signal.SIGKILL
        proc, info2 = spawn(state, info["port"], info["admin_port"])  # same state file, same ports
        _until(lambda: all(c.reconnects == 1 and c.connected for c in ranks),
               lambda: f"every rank to reconnect ({[(str(c._dead), c.reconnects, c.connected) for c in ranks]})")
        assert [c.restore_errors for c in ranks] == [[], [], [], []]  # every re-declaration and hold accepted
        groups = _admin_jobs(info2)["train"]["groups"]
        assert groups["pair"]["status"] == "granted" and groups["pair"]["holders"] == [0, 1]  # held again
        assert groups["quad"]["waiting"] == [2]  # the acquire was sent again
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(ranks[3].acquire, "quad")
            assert ranks[2].wait(waiting)["granted"] is True  # the old request's caller gets the new reply
            assert late.result(30)["granted"] is True
        with _admin(info2) as admin:
            assert admin.get("/state").json()["devices"]["rail1"]["circuits"] == {"2": 3, "3": 2}
        for c in ranks[:2]:
            c.release("pair")
        _until(lambda: _admin_jobs(info2)["train"]["groups"]["pair"]["holders"] == [], "pair to be released")
        assert [c.bye()["ok"] for c in ranks] == [True] * 4  # bye after a reconnect
    finally:
        for c in ranks:
            c.close()


def _admin_jobs(info: dict) -> dict:
    with _admin(info) as admin:
        return admin.get("/jobs").json()


def test_a_frozen_controller_ends_waits_in_one_line_within_the_bound(spawn, tmp_path):
    """SIGSTOP: its kernel still accepts, so the controller is stalled, not gone: waited for up to stall_timeout
    (past reconnect_timeout), then one line naming that bound (issue 31)."""
    proc, info = spawn(tmp_path / "c.db")
    token = _register(info, "train", 2)
    c = ControllerClient("127.0.0.1", info["port"], job="train", rank=0, token=token, timeout=600,
                         heartbeat_timeout=0.5, reconnect_timeout=1.0, stall_timeout=2.0)
    peer = ControllerClient("127.0.0.1", info["port"], job="train", rank=1, token=token, heartbeat_timeout=None)
    try:
        peer.hello(2, {"rail0": 1})
        c.hello(2, {"rail0": 0})
        c.declare("pair", [0, 1], {"rail0": {0: 1, 1: 0}})
        request = c.send("acquire", job="train", rank=0, key="pair")  # waits for rank 1, who never comes
        proc.send_signal(signal.SIGSTOP)
        with pytest.raises(InfeasibleError) as e:
            c.wait(request)  # within heartbeat_timeout + stall_timeout, not the 600 s timeout
        assert e.value.field == "controller" and "\n" not in str(e.value)
        assert "no heartbeat reply within 0.5 s" in str(e.value) and "stall_timeout 2 s" in str(e.value)
        assert "stalled" in str(e.value) and c.stalls == 1
    finally:
        proc.send_signal(signal.SIGCONT)
        c.close()
        peer.close()
