"""StragglAR synthesis benchmark: generate (and verify) the schedule, phase-2 rounds against the
lower bound at every power of two 4..1,024 (the cyclic exchange meets it) and at a few other n (the
greedy), and synthesis time at n = 1,024. Prints one JSON object; asserts nothing about speed.

Run: .venv/bin/python benchmarks/bench_stragglar.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

from lightrail.collectives import verify
from lightrail.collectives.stragglar import lower_bound, phase2, stragglar_allreduce

POWERS_OF_TWO = [2**k for k in range(2, 11)]
OTHERS = [6, 100, 255, 500, 1000, 1023]  # the greedy


def _row(n: int) -> dict:
    phase2.cache_clear()
    start = time.perf_counter()
    rounds = phase2(n).rounds
    phase2_s = time.perf_counter() - start
    schedule = stragglar_allreduce(n)  # phase 2 cached: adds phase 1 and the schedule's arrays
    synth_s = time.perf_counter() - start
    start = time.perf_counter()
    verify(schedule)
    verify_s = time.perf_counter() - start
    return {"ranks": n, "phase2_rounds": rounds, "lower_bound": lower_bound(n), "gap": rounds - lower_bound(n),
            "phase2_synthesis_s": round(phase2_s, 4), "synthesis_s": round(synth_s, 4),
            "verify_s": round(verify_s, 3), "transfers": schedule.ntransfers}


def main() -> None:
    powers = [_row(n) for n in POWERS_OF_TWO]
    others = [_row(n) for n in OTHERS]
    big = powers[-1]
    out = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "cpus": os.cpu_count()},
        "powers_of_two": powers,
        "bound_met_at_every_power_of_two": all(r["gap"] == 0 for r in powers),
        "other_n": others,
        "synthesis_s_at_1024": big["synthesis_s"], "verify_s_at_1024": big["verify_s"],
        "target_s": 10.0, "target_of": "synthesis at n=1024", "meets_target": big["synthesis_s"] < 10.0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
