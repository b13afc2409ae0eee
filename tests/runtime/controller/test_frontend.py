"""``controller serve --frontend native``: concentrator.c owns the rank connections and the controller serves them
through one stream. The rank-protocol tests that matter at the connection level (barrier, bad lines, caps, hello and
heartbeat timeouts, restart) run under both front ends (``frontend`` parametrized); here, what only this one has: a
rank that does not read its replies is paused without stalling the others, a concentrator that dies stops the
controller with one line, and a missing compiler is refused before anything is written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.runtime.controller.conftest import NATIVE_FRONTEND  # noqa: E402
from tests.runtime.controller.test_service import _register  # noqa: E402

from lightrail.runtime.controller.client import ControllerClient  # noqa: E402

pytestmark = pytest.mark.parametrize("frontend", [NATIVE_FRONTEND])


def test_a_rank_not_reading_its_replies_is_closed_at_a_bound_and_the_others_are_served(spawn, tmp_path, frontend):
    """Back-pressure: past 1 MiB of unwritten replies the concentrator stops reading the rank; the controller still
    answers what it was sent before, and at 4 MiB the rank is closed, so the concentrator never holds the 16 MB."""
    proc, info = spawn(tmp_path / "c.db", "--hello-timeout", "60s")
    n = 400_000  # 12 MB of requests, 16 MB of replies
    with socket.socket() as slow, socket.create_connection((info["host"], info["port"]), timeout=30) as other:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        slow.connect((info["host"], info["port"]))

        def flood() -> None:
            with contextlib.suppress(OSError):  # the concentrator may close it before all is sent
                slow.sendall(b"".join(b'{"id":%d,"op":"heartbeat"}\n' % (i + 1) for i in range(n)))

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        time.sleep(1.0)
        f = other.makefile("rb")
        for i in range(20):  # another connection is answered meanwhile
            other.sendall(b'{"id":%d,"op":"heartbeat"}\n' % (i + 1))
            reply = json.loads(f.readline())
            assert reply["ok"] is True and reply["id"] == i + 1
        assert _rss_bytes(info["frontend_pid"]) < 12 << 20
        slow.settimeout(30)
        data = b""
        with contextlib.suppress(ConnectionResetError):  # closed with requests unread: a reset may end it
            while chunk := slow.recv(1 << 16):
                data += chunk
        sender.join(30)
        ids = [json.loads(line)["id"] for line in data.split(b"\n")[:-1]]  # the last line may be cut
        assert ids == list(range(1, len(ids) + 1)) and len(ids) < n  # in order, and cut off: it was closed
    assert proc.poll() is None


def test_a_rank_reset_amid_its_replies_ends_only_its_connection(spawn, tmp_path, frontend):
    """Five ranks each send 20,000 requests and reset the connection (SO_LINGER 0) before reading a reply: the
    concentrator's reads and writes to them fail (the replies still come from the controller), and it serves the
    next connection. (The concentrator also ignores SIGPIPE, which a write racing a reset could raise.)"""
    proc, info = spawn(tmp_path / "c.db")
    for _ in range(5):
        with socket.create_connection((info["host"], info["port"]), timeout=30) as gone:
            gone.sendall(b"".join(b'{"id":%d,"op":"heartbeat"}\n' % (i + 1) for i in range(20_000)))
            gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
    time.sleep(0.5)
    with socket.create_connection((info["host"], info["port"]), timeout=30) as other:
        other.sendall(b'{"id":1,"op":"heartbeat"}\n')
        assert json.loads(other.makefile("rb").readline())["ok"] is True
    assert proc.poll() is None


def _rss_bytes(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def test_a_concentrator_that_dies_stops_the_controller_with_one_line(spawn, tmp_path, frontend):
    """... and fails no rank: their connections went with it, and they reconnect to the restarted controller."""
    proc, info = spawn(tmp_path / "c.db")
    token = _register(info, "j", 2)
    ranks = [ControllerClient(info["host"], info["port"], job="j", rank=r, token=token, heartbeat_timeout=None)
             for r in range(2)]
    for r, c in enumerate(ranks):
        c.hello(2, {"rail0": r})
    os.kill(info["frontend_pid"], signal.SIGKILL)
    assert proc.wait(15) != 0
    for c in ranks:
        c.close()
    log = (tmp_path / "controller-0.log").read_text()
    assert '"event": "frontend_lost"' in log and "rank_failed" not in log
    last = log.strip().splitlines()[-1]
    assert "native front end (concentrator) exited" in last and "Traceback" not in log


def test_no_compiler_is_refused_before_anything_is_written(tmp_path, frontend):
    for cc in ("/bin/false", "/nonexistent/cc"):
        done = subprocess.run([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", "0",
                               "--admin-port", "0", "--state", str(tmp_path / "c.db"), "--frontend", "native"],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "CC": cc})
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "--frontend" in lines[0] and cc in lines[0] and "Traceback" not in done.stderr
        assert list(tmp_path.iterdir()) == []  # no state file, no lock
    done = subprocess.run([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--state",
                           str(tmp_path / "c.db"), "--frontend", "kernel"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--frontend" in done.stderr and "loop or native" in done.stderr
    assert list(tmp_path.iterdir()) == []
