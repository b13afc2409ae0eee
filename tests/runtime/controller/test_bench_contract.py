"""``benchmarks/bench_controller.py --ranks N`` keeps issue 17's contract: it prints one JSON object with ``p99_s`` and
``dropped`` (and the floor server's run beside the controller's, with the same keys; with ``--native-floor`` the C
floor server's too). Run small here (16 ranks, 3 rounds) as a real process against a real controller, with the Python
emulated ranks and the native ones; the figures themselves are the benchmark's, never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightrail.runtime.controller.frontend import c_compiler

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_controller.py"
ONE_CPU = not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
BUILDS = c_compiler() is not None and sys.platform.startswith("linux")


def test_bench_controller_ranks_defaults_to_the_controllers_configuration_for_scale():
    """Plain ``--ranks N`` (the contract command): the native front end and the native emulated ranks where they build,
    the server pinned alone on a CPU; else the loop front end and the Python ranks, unpinned. The JSON says which."""
    pytest.importorskip("uvicorn")
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "8", "--rounds", "2", "--warmup", "1", "--no-floor"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["dropped"] == 0 and out["acquires"] == 8 * 2
    assert out["emulated_ranks"] == ("native" if BUILDS else "python")
    assert out["frontend"] == ("native" if BUILDS else "loop")
    if BUILDS and not ONE_CPU:
        cpus = sorted(os.sched_getaffinity(0))
        assert out["pinned"] == {"server_cpus": cpus[:1], "other_cpus": cpus[1:]}
    else:
        assert out["pinned"] is None
    odd = subprocess.run([sys.executable, str(BENCH), "--ranks", "7", "--rounds", "2", "--warmup", "1", "--no-floor"],
                         capture_output=True, text=True, timeout=300)  # auto: the native pairs need an even count
    assert odd.returncode == 0 and json.loads(odd.stdout)["emulated_ranks"] == "python", odd.stderr[-2000:]


@pytest.mark.skipif(ONE_CPU or not sys.platform.startswith("linux"), reason="pinning needs 2 CPUs and Linux")
def test_pinning_puts_every_thread_of_the_server_on_its_cpu_and_the_rest_elsewhere(tmp_path):
    """A thread's CPU affinity is its own: pinning only a server's main thread would leave its others (the admin
    server's, the store's) free to run anywhere. Every thread of a threaded child gets the server's CPU, and what the
    run starts inside the pinning (a child of this process) gets the others; leaving restores this process's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_controller", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    before = os.sched_getaffinity(0)
    pin = bench.Pinning.make(True)
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]"
                              "\nprint(flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()  # its threads are running
        pin.server_started(child.pid)
        tasks = list(Path(f"/proc/{child.pid}/task").iterdir())
        assert len(tasks) == 4 and all(os.sched_getaffinity(int(t.name)) == set(pin.server) for t in tasks)
        with pin:
            other = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                   capture_output=True, text=True)
        assert json.loads(other.stdout) == pin.others and pin.server[0] not in pin.others
        assert os.sched_getaffinity(0) == before
    finally:
        child.kill()
        child.wait()
    assert bench.Pinning.make(False) is None


@pytest.mark.parametrize("native", [False, True], ids=["python-ranks", "native-ranks"])
def test_bench_controller_ranks_prints_the_contract_keys_with_nothing_dropped(native):
    """Native: the ranks, the floor and the controller's front end all in C; else all in Python, unpinned."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    if native and c_compiler() is None:
        pytest.skip("--native-ranks needs a C compiler")
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--rounds", "3", "--warmup", "1",
                           "--time-limit", "120",
                           *(["--native-ranks", "--native-floor", "--frontend", "native"] if native else
                             ["--emulated-ranks", "python", "--frontend", "loop"])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert "error" not in out, out
    assert out["emulated_ranks"] == ("native" if native else "python")
    assert out["frontend"] == ("native" if native else "loop") and (out["pinned"] is None) == (not native or ONE_CPU)
    if native:  # counted from before the program starts: every acquire and release of the 4 rounds
        assert out["requests_handled"] >= 16 * 4 * 2
    assert out["ranks"] == 16 and out["groups"] == 8 and out["dropped"] == 0
    assert out["acquires"] == out["acquires_expected"] == 16 * 3
    assert 0 < out["p50_s"] <= out["p99_s"] <= out["max_s"]
    assert out["controller_metrics"]["unsafe_reconfigurations"] == 0
    assert ("frontend_cpu_us_per_request" in out) == native  # the concentrator's CPU, counted apart
    for name in ("floor", "native_floor") if native else ("floor",):
        floor = out[name]
        assert "error" not in floor, floor
        assert floor["dropped"] == 0 and floor["acquires"] == 16 * 3 and 0 < floor["p99_s"]
        assert floor["emulated_ranks"] == out["emulated_ranks"] and floor["floor_server_cpu_s"] >= 0
    assert ("native_floor" in out) == native


@pytest.mark.parametrize("flag", ["--native-ranks", "--native-floor"])
def test_bench_controller_native_programs_refuse_a_missing_compiler_in_one_line(flag):
    for cc in ("/bin/false", "/nonexistent/cc"):  # a compiler that fails, one that is not there
        done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", flag], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "CC": cc})
        assert done.returncode == 2 and flag in done.stderr and cc in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bench_controller_native_ranks_refuses_pace_and_sweep_refuses_the_native_floor():
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--native-ranks", "--pace", "0.1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--native-ranks" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--sweep", "--native-floor"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--sweep" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("frontend", ["loop", "native"])
def test_bench_controller_sweep_writes_latency_against_load(tmp_path, frontend):
    pytest.importorskip("uvicorn")
    pytest.importorskip("matplotlib")
    if frontend == "native" and c_compiler() is None:
        pytest.skip("--frontend native needs a C compiler")
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--rounds", "3", "--warmup", "1", "--sweep",
                           "--paces", "0,0.02", "--frontend", frontend], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert [p["pace_s"] for p in out["points"]] == [0.02, 0.0]  # slowest first, full rate last
    assert all(p["error"] is None and p["dropped"] == 0 and p["acquires"] == 16 * 3 for p in out["points"])
    assert out["p99_s"] == out["points"][-1]["p99_s"] and out["dropped"] == 0
    meeting = [p["rate_per_s"] for p in out["points"] if p["p99_s"] < out["target_p99_s"]]
    assert out["max_rate_meeting_target_per_s"] == max(meeting, default=None)
    stem = tmp_path / "out/bench" / ("controller-load-native" if frontend == "native" else "controller-load")
    assert out["frontend"] == frontend and json.loads(stem.with_suffix(".json").read_text()) == out
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "out/bench").iterdir())) == 2  # one front end's files, not the other's
    bad = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--sweep", "--paces", "0,fast"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and "--paces" in bad.stderr and "Traceback" not in bad.stderr
