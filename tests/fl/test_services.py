"""``lightrail fl serve`` and ``fl demo`` as real processes on loopback with a real PostgreSQL: the ready line,
jobs bound in the policy's order through the load balancer, rounds ended by results, a client manager killed
with SIGKILL replaced without losing bindings, SIGTERM leaving no process behind; bad input exits 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from lightrail.fl import store

SERVE = [sys.executable, "-m", "lightrail.cli", "fl", "serve"]


@pytest.fixture
def serve(tmp_path, gone, read_ready):
    """Start ``fl serve`` (stderr to a file); killed with its children at teardown if a test left it running."""
    started = []

    def start(*args):
        log = tmp_path / f"serve{len(started)}.log"
        proc = subprocess.Popen([*SERVE, *args], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        started.append(proc)
        info = read_ready(proc)
        started.append(info)
        return proc, info, log

    yield start
    for item in started:
        if isinstance(item, subprocess.Popen) and item.poll() is None:
            item.send_signal(signal.SIGTERM)
            try:
                item.wait(30)
            except subprocess.TimeoutExpired:
                item.kill()
        if isinstance(item, dict):
            for pid in _pids(item):
                if not gone(pid, 0.0):
                    os.kill(pid, signal.SIGKILL)


def _pids(info: dict) -> list[int]:
    out = []
    for v in info["pids"].values():
        out.extend(v if isinstance(v, list) else [v])
    return out


def _events(log, name):
    return [json.loads(line) for line in log.read_text().splitlines()
            if line.startswith("{") and json.loads(line).get("event") == name]


def test_serve_binds_in_policy_order_survives_a_killed_manager_and_stops_clean(serve, gone):
    proc, info, log = serve("--policy", "srsf", "--client-managers", "2", "--leaves", "0")
    assert {"db", "job_manager", "scheduler", "client_managers", "load_balancer", "parameter_servers"} <= set(info)
    assert len(info["client_managers"]) == 2
    url = lambda key: f"http://127.0.0.1:{info[key]}"  # noqa: E731
    lb = url("load_balancer")
    with httpx.Client(timeout=10) as h:
        # the big job arrives first (fifo would serve it first); srsf serves the small one first
        # (no over-selection: a round's places are its demand, as the counts below assume)
        big = h.post(url("job_manager") + "/jobs", json={"rounds": 3, "demand": 3, "over_selection": 1}).json()["job"]
        small = h.post(url("job_manager") + "/jobs", json={"rounds": 1, "demand": 3, "over_selection": 1,
                                                           "requirements": {"os": ["android", "ios"]}}).json()["job"]
        order = h.post(url("scheduler") + "/schedule").json()
        assert order["jobs"] == [small, big] and order["policy"] == "srsf"

        def checkin(i, os_="android"):
            r = h.post(lb + "/checkin", json={"client_id": f"c{i}", "cpu_ghz": 2.0, "memory_gb": 4.0, "os": os_})
            assert r.status_code == 200, r.text
            return r.json()

        first = [checkin(i) for i in range(3)]
        assert [b["job"] for b in first] == [small] * 3
        assert checkin(3)["job"] == big  # the small job's round is full
        assert checkin(4, "linux")["job"] == big  # not eligible for the small job
        assert {b["manager"] for b in first} == {"client_manager-0", "client_manager-1"}  # round-robin
        for i in range(3):
            r = h.post(lb + "/result", json={"client_id": f"c{i}", "job": small, "round": 0})
            assert r.status_code == 200, r.text
        jobs = {j["id"]: j for j in h.get(url("job_manager") + "/jobs").json()}
        assert jobs[small]["done_at"] is not None and jobs[small]["rounds_completed"] == 1
        again = h.post(lb + "/result", json={"client_id": "c0", "job": small, "round": 0})
        assert again.status_code == 200 and again.json()["duplicate"] is True  # a retry: counted once
        assert h.post(lb + "/result", json={"client_id": "c99", "job": small, "round": 0}).status_code == 409

        with store.connect(info["db"]) as db:
            before = db.execute("SELECT id, client_id, job, round FROM bindings ORDER BY id").fetchall()
        victim = info["pids"]["client_managers"][0]
        os.kill(victim, signal.SIGKILL)
        assert gone(victim)
        # check-ins keep succeeding through the load balancer while the manager is replaced
        late = [checkin(10 + i) for i in range(6)]
        assert all(b["job"] == big for b in late[:1]) and sum(b["job"] == big for b in late) == 1
        deadline = time.monotonic() + 30
        while not _events(log, "replaced") and time.monotonic() < deadline:
            time.sleep(0.1)
        replaced = _events(log, "replaced")
        assert replaced and replaced[0]["service"] == "client_manager" and replaced[0]["old_pid"] == victim
        new_pid = replaced[0]["new_pid"]
        with store.connect(info["db"]) as db:
            rows = store.services(db, "client_manager")
            assert {r["pid"] for r in rows} == {new_pid, info["pids"]["client_managers"][1]}
            after = db.execute("SELECT id, client_id, job, round FROM bindings ORDER BY id").fetchall()
            assert after[:len(before)] == before
            assert store.double_bookings(db)["total"] == 0
        time.sleep(0.6)  # the load balancer re-reads the list
        managers = {checkin(20 + i)["manager"] for i in range(4)}
        assert managers == {"client_manager-0", "client_manager-1"}  # the replacement serves again
        for i in (3, 4, 10):
            assert h.post(lb + "/result", json={"client_id": f"c{i}", "job": big, "round": 0}).status_code == 200
        assert h.get(url("job_manager") + f"/jobs/{big}").json()["round"] == 1

    pids = [*_pids(info), new_pid]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    for pid in pids:
        assert gone(pid), f"pid {pid} outlived fl serve"
    assert not os.path.exists(info["data"]), "the temporary data directory was left behind"


def test_unknown_policy_exits_2_naming_the_flag():
    r = subprocess.run([*SERVE, "--policy", "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--policy" in lines[0] and "bogus" in lines[0]
    assert r.stdout == "" and "postgres_ready" not in r.stderr  # nothing was started


def test_demo_json_reports_no_double_booking_and_all_jobs_done():
    # ~15 s; the demo waits up to 120 s for its jobs, then reports: a bound past that shows what it saw (once in
    # this file's ~10 suite runs it was killed at a 120 s bound, before it could say, issue 31's session)
    r = subprocess.run([sys.executable, "-m", "lightrail.cli", "fl", "demo", "--clients", "200", "--jobs", "3",
                        "--json"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["double_bookings"] == 0 and out["all_jobs_completed"], (r.stdout[-3000:], r.stderr[-2000:])
    assert out["bindings"] > 0 and out["bindings_per_s"] > 0 and out["supervisor_exit"] == 0
    assert out["rounds_completed"] == sum(j["rounds"] for j in out["per_job"])


@pytest.mark.slow
def test_demo_without_leaves_over_selects_and_counts_late_results():
    """The real services run rounds as the simulator does: 1.3x demand bound, a round ends at demand results."""
    r = subprocess.run([sys.executable, "-m", "lightrail.cli", "fl", "demo", "--clients", "200", "--jobs", "3",
                        "--leaves", "0", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["over_selection"] == 1.3 and out["double_bookings"] == 0 and out["all_jobs_completed"]
    assert out["results"] == sum(j["rounds"] * j["demand"] for j in out["per_job"])  # exactly demand per round
    assert out["bindings"] > out["results"] >= out["late_results"] >= 0  # extra places were bound
