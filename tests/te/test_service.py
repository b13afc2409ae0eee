"""``lightrail te serve``: real controller processes on loopback. The network's metrics are what
``realize`` gives for the controllers' allocations; a controller killed by ``--kill`` or from outside
takes down exactly its slice's share of the epoch's demand while the others keep publishing; no
controller process outlives the network; bad input exits 2 naming the flag before any process starts."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.te.decentral import realize
from lightrail.te.formulations import TeProblem
from lightrail.te.prepare import DEFAULT_LAMBDA, TeSetup, prepare
from lightrail.te.service import owned_paths, view
from lightrail.te.slicing import slice_nodes

SERVE = [sys.executable, "-m", "lightrail.cli", "te", "serve", "--topology", "abilene", "--slices", "3"]
STARTUP_S = 90.0


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """The process no longer exists (or is a zombie about to be reaped by init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    return not _gone(pid, timeout=0.0)


@pytest.fixture
def servers():
    """Servers started by a test; any still running at teardown is killed with its controllers."""
    started: list[tuple[subprocess.Popen, list[int]]] = []
    yield started
    for proc, pids in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:
            if not _gone(pid, 0.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_serve_kill_blast_radius_matches_realize_and_leaves_no_process(tmp_path):
    epochs, kill, kill_at, perturbation = 6, 1, 3, 0.05
    log = tmp_path / "allocations.jsonl"
    proc = subprocess.run([*SERVE, "--epochs", str(epochs), "--interval", "0.3", "--kill", str(kill),
                           "--kill-at-epoch", str(kill_at), "--allocations", str(log), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run = json.loads(proc.stdout)
    for c in run["controllers"]:
        assert _gone(c["pid"]), f"controller {c['slice']} (pid {c['pid']}) outlived the network"

    # the same network, slicing and traffic, computed here independently of the processes
    net = prepare(TeSetup(topology="abilene", slices=3, matrices=epochs, seed=0))
    paths, wan = net.paths, net.wan
    slice_of = slice_nodes("randomized", wan, 3, net.node_traffic(), seed=0)
    owner = slice_of[paths.pairs[:, 0]]
    assert [c["nodes"] for c in run["controllers"]] == [[wan.nodes[v] for v in np.flatnonzero(slice_of == s)]
                                                         for s in range(3)]
    assert len({c["pid"] for c in run["controllers"]} | {os.getpid()}) == 4  # three processes of their own
    weights = net.node_traffic()
    for s in range(3):
        assert run["blast_radius"][str(s)] == pytest.approx(weights[slice_of == s].sum() / weights.sum())
    assert run["controllers"][kill]["died_at_epoch"] == kill_at
    assert all(run["controllers"][s]["died_at_epoch"] is None for s in (0, 2))

    logged: dict[tuple[int, int], np.ndarray] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        assert entry["paths"] == owned_paths(paths, slice_of, entry["slice"]).tolist()  # only its own demands
        logged[entry["epoch"], entry["slice"]] = np.array(entry["flows"])

    # an in-process controller on the same views: its path split may differ (the regularizer makes link
    # utilizations unique, not path flows), so only the realized throughput is compared, loosely
    problem = TeProblem(paths.incidence, paths.path_demand, wan.capacity, "max-flow", DEFAULT_LAMBDA)
    assert [r["epoch"] for r in run["epochs"]] == list(range(epochs))
    for row in run["epochs"]:
        e, demand = row["epoch"], net.demands[row["epoch"]]
        up = [0, 1, 2] if e < kill_at else [0, 2]
        assert row["alive"] == len(up)
        assert row["fresh"] == up  # the survivors keep publishing after the kill
        assert sorted(s for (t, s) in logged if t == e) == up
        flows, mine = np.zeros((3, paths.paths)), np.zeros((3, paths.paths))
        for s in up:
            own = owned_paths(paths, slice_of, s)
            flows[s, own] = logged[e, s]
            asked = paths.per_demand(flows[s])[owner == s]
            assert np.all(flows[s] >= 0) and np.all(asked <= demand[owner == s] * (1 + perturbation) + 1e-6)
            mine[s, own] = problem.solve(view(demand, perturbation, 0, s, e))[own]
        # the network's metrics are exactly realize's on the allocations it received
        got = {m: row[m] for m in ("divergence_overload_fraction", "worst_link_overload", "throughput",
                                   "max_link_utilization")}
        expected = realize(paths, wan.capacity, demand, flows, owner)[0].to_dict()
        assert got == {m: expected[m] for m in got}, e
        here = realize(paths, wan.capacity, demand, mine, owner)[0].to_dict()
        assert row["throughput"] == pytest.approx(here["throughput"], abs=0.01), e
        if e < kill_at:
            assert row["affected_fraction"] == 0.0
        else:  # exactly the killed slice's share of this epoch's demand
            assert row["affected_fraction"] == demand[owner == kill].sum() / demand.sum()
            assert row["affected_fraction"] > 0.1
    before, after = run["epochs"][kill_at - 1]["throughput"], run["epochs"][kill_at]["throughput"]
    assert after < before - 0.1  # the killed slice's traffic is no longer delivered


def _lines(proc: subprocess.Popen, until, timeout: float) -> list[dict]:
    """JSON lines from the server's stderr until ``until(lines)`` holds."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    lines: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = proc.stderr.readline()
                if not line:
                    raise AssertionError(f"the server exited ({proc.wait()}): {lines}")
                if line.startswith("{"):
                    lines.append(json.loads(line))
                    if until(lines):
                        return lines
        raise AssertionError(f"timed out; got {lines}")
    finally:
        sel.close()


def test_controller_killed_from_outside_others_keep_running_sigterm_stops_all(servers):
    proc = subprocess.Popen([*SERVE, "--epochs", "0", "--interval", "0.2", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    servers.append((proc, []))
    (ready,) = _lines(proc, lambda ls: ls[-1].get("event") == "ready", STARTUP_S)
    pids = [c["pid"] for c in ready["controllers"]]
    servers[-1][1].extend(pids)
    assert ready["port"] > 0 and all(_alive(p) for p in pids)
    _lines(proc, lambda ls: ls[-1].get("event") == "epoch" and ls[-1]["alive"] == 3, 30)

    os.kill(pids[0], signal.SIGKILL)
    seen = _lines(proc, lambda ls: sum(x.get("event") == "epoch" and x["alive"] == 2 for x in ls) >= 3, 30)
    dead = [x for x in seen if x.get("event") == "dead"]
    assert [x["slice"] for x in dead] == [0]
    later = [x for x in seen if x.get("event") == "epoch" and x["alive"] == 2]
    assert all(x["fresh"] == [1, 2] and x["affected_fraction"] > 0 for x in later[1:])
    assert proc.poll() is None and _alive(pids[1]) and _alive(pids[2])

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    run = json.loads(out)
    assert run["stopped"] is True and len(run["epochs"]) >= 4
    assert run["controllers"][0]["died_at_epoch"] is not None
    assert all(run["controllers"][s]["died_at_epoch"] is None for s in (1, 2))
    for pid in pids:
        assert _gone(pid), f"pid {pid} outlived the network"


runner = CliRunner()


@pytest.fixture
def no_processes(monkeypatch):
    """Bad input must fail before any controller process starts."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")
    monkeypatch.setattr("lightrail.te.service.subprocess.Popen", refuse)


@pytest.mark.parametrize("args, flag", [
    (["--kill", "7"], "--kill"),
    (["--kill", "-1"], "--kill"),
    (["--kill-at-epoch", "2"], "--kill-at-epoch"),
    (["--kill", "0", "--kill-at-epoch", "6", "--epochs", "6"], "--kill-at-epoch"),
    (["--interval", "0"], "--interval"),
    (["--epochs", "-1"], "--epochs"),
    (["--port", "70000"], "--port"),
    (["--seed", "-1"], "--seed"),
    (["--slices", "13"], "--slices"),
    (["--slicer", "alphabetical"], "--slicer"),
    (["--objective", "max-fun"], "--objective"),
    (["--topology", "nowhere"], "--topology"),
    (["--lambda", "-1"], "--lambda"),
    (["--perturbation", "1.5"], "--perturbation"),
])
def test_bad_input_exits_2_naming_the_flag_without_starting_processes(no_processes, args, flag):
    result = runner.invoke(app, ["te", "serve", "--topology", "abilene", *args])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and flag in text and "Traceback" not in text, text
