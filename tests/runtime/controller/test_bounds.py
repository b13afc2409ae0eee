"""Bounds on the controller (issue 31 item 5): a flood of half-open requests on the admin port, at a lowered fd
limit, leaves /healthz and new rank connections working; a group key or phase over ``MAX_NAME`` characters is
refused naming the field; ``--rails``/``--ports`` past the limits are refused before anything is written."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.runtime.controller.protocol import MAX_NAME

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

FD_LIMIT = 256


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_half_open_admin_requests_leave_healthz_and_ranks_working(tmp_path):
    """2,000 connections that each send half a request, against a controller limited to 256 descriptors."""
    log = open(tmp_path / "c.log", "w")  # noqa: SIM115
    cmd = [sys.executable, "-m", "lightrail.cli", "controller", "serve", "--state", str(tmp_path / "c.db"), "--port",
           "0", "--admin-port", "0", "--rails", "1", "--ports", "8"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_limited)
    flood: list[socket.socket] = []
    try:
        info = json.loads(proc.stdout.readline())
        assert info["max_connections"] < FD_LIMIT  # the rank cap leaves room for the admin API
        for _ in range(2000):
            try:
                s = socket.create_connection(("127.0.0.1", info["admin_port"]), timeout=5)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never finished
                flood.append(s)
            except OSError:
                pass
        for _ in range(3):
            r = httpx.get(f"http://127.0.0.1:{info['admin_port']}/healthz", timeout=10)
            assert r.status_code == 200 and r.json() == {"ok": True}
        with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as rank:
            rank.sendall(b'{"id": 1, "op": "heartbeat"}\n')
            assert json.loads(rank.makefile("rb").readline())["ok"]
    finally:
        for s in flood:
            s.close()
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        log.close()


def test_a_group_key_or_phase_too_long_is_refused_naming_the_field(make, hello):
    from lightrail.runtime.controller.protocol import parse_request

    for field in ("key", "phase"):
        message = {"id": 1, "op": "group", "job": "j", "key": "k", "phase": "dp", "members": [0],
                   "circuits": {}, field: "x" * (MAX_NAME + 1)}
        with pytest.raises(Exception) as e:
            parse_request(json.dumps(message).encode())
        assert getattr(e.value, "field", None) == field and str(MAX_NAME) in str(e.value)


@pytest.mark.parametrize(("args", "field"), [(["--rails", "1000000"], "--rails"),
                                             (["--ports", "1000000000"], "--ports"),
                                             (["--rails", "1024", "--ports", "65536"], "--ports")])
def test_huge_fabrics_are_refused_up_front(tmp_path, args, field):
    done = CliRunner().invoke(app, ["controller", "serve", "--state", str(tmp_path / "c.db"), "--port", "0",
                                    "--admin-port", "0", *args])
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert done.exit_code == 2 and len(lines) == 1 and field in lines[0], done.output
    assert list(tmp_path.iterdir()) == []  # no state, no lock file


def test_a_full_or_busy_state_file_is_the_servers_trouble_not_a_bad_request():
    from lightrail.errors import InfeasibleError, ScenarioError
    from lightrail.runtime.controller.admin import _status

    full = InfeasibleError("the state file c.db could not be written (database or disk is full)", field="state")
    busy = InfeasibleError("the state file c.db could not be written (database is locked)", field="state")
    assert (_status(full), _status(busy), _status(ScenarioError("bad", field="world"))) == (507, 503, 400)
