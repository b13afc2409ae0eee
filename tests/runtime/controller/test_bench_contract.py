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


@pytest.mark.parametrize("native", [False, True], ids=["python-ranks", "native-ranks"])
def test_bench_controller_ranks_prints_the_contract_keys_with_nothing_dropped(native):
    """Native: the ranks, the floor and the controller's front end all in C."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    if native and c_compiler() is None:
        pytest.skip("--native-ranks needs a C compiler")
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--rounds", "3", "--warmup", "1",
                           "--time-limit", "120",
                           *(["--native-ranks", "--native-floor", "--frontend", "native"] if native else [])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert "error" not in out, out
    assert out["emulated_ranks"] == ("native" if native else "python")
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
