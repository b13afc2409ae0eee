"""Reconfiguration-aware collectives benchmark: the full default study grid, and planning one large case.
Prints one JSON object; asserts nothing about speed.

Run: .venv/bin/python benchmarks/bench_pccl.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

from lightrail.collectives import generate
from lightrail.control.pccl import Planner
from lightrail.fabric.params import ReconfigurableFabric
from lightrail.studies.collective_study import StudyGrid, collective_study


def main() -> None:
    grid = StudyGrid()
    start = time.perf_counter()
    result = collective_study(grid)
    study_s = time.perf_counter() - start
    start = time.perf_counter()
    planner = Planner(generate("allreduce", "halving-doubling", 1024), ReconfigurableFabric(n=1024, ports=2))
    planner.totals(grid.sizes, grid.delays)
    plan_s = time.perf_counter() - start
    out = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "cpus": os.cpu_count()},
        "study_default_grid": {"cells": len(result.cells), "ops": len(grid.ops), "ranks": list(grid.ranks),
                               "sizes": len(grid.sizes), "delays": len(grid.delays), "seconds": round(study_s, 2),
                               "target_s": 300, "meets_target": study_s < 300},
        "plan_halving_doubling_1024_all_sizes_and_delays_s": round(plan_s, 3),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
