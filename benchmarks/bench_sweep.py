"""Wall time of a 500-cell sweep file (examples/sweeps/debug-500.yaml) on a local Ray against one process
(``--local``), each as a user runs it (``lightrail sweep FILE``, Ray's start-up included). Prints JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "examples" / "sweeps" / "debug-500.yaml"


def run(*flags: str) -> dict:
    out = ROOT / "out" / "bench-sweep" / ("local" if "--local" in flags else "ray")
    command = [sys.executable, "-m", "lightrail.cli", "sweep", str(SWEEP), "--out", str(out), "--json", *flags]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    result = json.loads(done.stdout)
    return {"command": "lightrail sweep examples/sweeps/debug-500.yaml " + " ".join(flags),
            "cells": result["cells"], "failed": result["failed"], "runner": result["runner"], "wall_s": round(wall, 2),
            "cells_wall_s": round(result["wall_s"], 2)}


if __name__ == "__main__":
    cpus = os.cpu_count()
    rows = [run("--local"), run("--cpus", str(cpus))]
    print(json.dumps({"benchmark": "sweep-500", "cpus": cpus, "runs": rows}, indent=2))
