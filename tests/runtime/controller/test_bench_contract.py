"""``benchmarks/bench_controller.py --ranks N`` keeps issue 17's contract: it prints one JSON object with ``p99_s`` and
``dropped`` (and the floor server's run beside the controller's, with the same keys). Run small here (16 ranks, 3
rounds) as a real process against a real controller; the figures themselves are the benchmark's, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_controller.py"


def test_bench_controller_ranks_prints_the_contract_keys_with_nothing_dropped():
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    done = subprocess.run([sys.executable, str(BENCH), "--ranks", "16", "--rounds", "3", "--warmup", "1",
                           "--time-limit", "120"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert "error" not in out, out
    assert out["ranks"] == 16 and out["groups"] == 8 and out["dropped"] == 0
    assert out["acquires"] == out["acquires_expected"] == 16 * 3
    assert 0 < out["p50_s"] <= out["p99_s"] <= out["max_s"]
    assert out["controller_metrics"]["unsafe_reconfigurations"] == 0
    floor = out["floor"]
    assert "error" not in floor, floor
    assert floor["dropped"] == 0 and floor["acquires"] == 16 * 3 and 0 < floor["p99_s"]
