"""Photonic-rails benchmark: one iteration of the default scenario (2,048 GPUs), 16,384 GPUs, 65,536 GPUs (Llama-3
405B, one iteration), and a full delay sweep. Prints one JSON object; asserts nothing about speed (see the README).

Run: .venv/bin/python benchmarks/bench_opus.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from lightrail.fabric.params import OCS_DELAYS
from lightrail.scenario import load_scenario, parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.studies.rails import compare_rails, delay_sweep
from lightrail.workload.program import build_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def timed(fn, repeats=1):
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def one_iteration(built):
    program = build_program(built.job, defer_dp=built.params.defer_dp)
    return simulate_iteration(program, built.fabric, built.params)


def main() -> None:
    default = load_scenario(None)[0].build()
    big = parse_scenario({"name": "llama3-70b-16384xh100", "model": "llama3-70b",
                          "cluster": {"gpus": 16384, "gpu": "h100"}, "parallel": {"tp": 8, "pp": 16, "dp": 128},
                          "job": {"micro_batches": 32}}).build()
    t_default, r_default = timed(lambda: one_iteration(default), repeats=3)
    t_compare, c_default = timed(lambda: compare_rails(default))
    t_big, r_big = timed(lambda: one_iteration(big))
    t_big_compare, c_big = timed(lambda: compare_rails(big))
    huge = load_scenario(EXAMPLES / "llama3-405b-65536xh200.yaml")[0].build()  # TP8 x PP16 x DP512, 7+14x8+7 layers
    t_huge, r_huge = timed(lambda: one_iteration(huge))
    delays = list(OCS_DELAYS)
    t_sweep, sweep = timed(lambda: delay_sweep(default, delays))
    out = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "cpus": os.cpu_count()},
        "default_2048": {"scenario": default.scenario.name, "simulate_one_iteration_s": round(t_default, 3),
                         "simulate_command_s": round(t_compare, 3), "iteration_time_s": r_default.iteration_time_s,
                         "overhead": c_default.overhead, "target_s": 10, "meets_target": t_default < 10},
        "large_16384": {"scenario": big.scenario.name, "simulate_one_iteration_s": round(t_big, 3),
                        "simulate_command_s": round(t_big_compare, 3), "iteration_time_s": r_big.iteration_time_s,
                        "overhead": c_big.overhead, "target_s": 60, "meets_target": t_big < 60},
        "huge_65536": {"scenario": huge.scenario.name, "simulate_one_iteration_s": round(t_huge, 3),
                       "iteration_time_s": r_huge.iteration_time_s, "target_s": 10, "meets_target": t_huge < 10},
        "delay_sweep_default": {"delays": len(delays), "simulations": len(sweep.runs) + 1,
                                "seconds": round(t_sweep, 3), "target_s": 120, "meets_target": t_sweep < 120},
    }
    out["all_targets_met"] = all(v["meets_target"] for v in out.values() if isinstance(v, dict) and "meets_target" in v)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
