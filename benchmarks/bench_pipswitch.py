"""PipSwitch benchmark: plan all-to-all rounds on an n x n crossbar of 2x2 cells for 32, 64 and 128 ports.
Prints one JSON object with timings and cell changes; asserts nothing about speed.

Run: .venv/bin/python benchmarks/bench_pipswitch.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

from lightrail.control.pipswitch import plan_pipswitch

PORTS = (32, 64, 128)
REPEATS = 3


def main() -> None:
    cases = []
    for n in PORTS:
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = plan_pipswitch(n)
            times.append(time.perf_counter() - start)
        cases.append({"ports": n, "rounds": len(result.rounds), "lower_bound_rounds": result.lower_bound_rounds,
                      "cells": result.cells, "realizable": result.realizable, "cell_changes": result.cell_changes,
                      "naive_cell_changes": result.naive_cell_changes, "relabelling": result.relabelling,
                      "seconds_median": round(float(np.median(times)), 3), "seconds_all": [round(t, 3) for t in times],
                      "target_s": 10})
    out = {"machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                       "cpus": os.cpu_count()},
           "mesh": "crossbar", "repeats": REPEATS, "cases": cases}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
