"""StragglAR synthesis benchmark: generate (and verify) the schedule for large rank counts, rounds
against the lower bound. Prints one JSON object; asserts nothing about speed.

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


def main() -> None:
    rows = []
    for n in (128, 256, 512, 1024):
        phase2.cache_clear()
        start = time.perf_counter()
        schedule = stragglar_allreduce(n)
        synth_s = time.perf_counter() - start
        start = time.perf_counter()
        verify(schedule)
        verify_s = time.perf_counter() - start
        rounds = phase2(n).rounds
        rows.append({"ranks": n, "synthesis_s": round(synth_s, 3), "verify_s": round(verify_s, 3),
                     "phase2_rounds": rounds, "lower_bound": lower_bound(n), "gap": rounds - lower_bound(n),
                     "transfers": schedule.ntransfers})
    big = rows[-1]
    out = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "cpus": os.cpu_count()},
        "rows": rows,
        "target_s": 10.0, "target_of": "synthesis at n=1024", "meets_target": big["synthesis_s"] < 10.0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
