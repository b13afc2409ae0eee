"""CLI start-up benchmark: wall time of ``lightrail --version``, ``lightrail algorithms``, ``lightrail --help``,
a 4,096-rank ring AllReduce (``lightrail collective``), the small jobs of issue 33 (``simulate`` of
examples/debug-tiny.yaml with ``--json --no-ablation``, ``collective --ranks 256``) and, with ``--big``, the
65,536-GPU example's default table (each a fresh process, best and median of N runs, bytecode cached as on a
user's machine), the floor under them (the interpreter, ``import numpy``, ``import numpy, typer.main``), whether
``algorithms`` imports numpy, and the ten largest cumulative imports of
``import lightrail.cli`` from ``python -X importtime``. Prints one JSON object; asserts nothing about speed
(the goals, issue "a CLI that starts at once": ``--version`` and ``algorithms`` under 0.2 s, the 4,096-rank ring
under 0.5 s).

Run: .venv/bin/python benchmarks/bench_startup.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

RING_4096 = ["collective", "--op", "allreduce", "--algo", "ring", "--ranks", "4096", "--size", "1GiB", "--topology",
             "ring", "--bandwidth", "50GBps", "--latency", "500ns", "--alpha", "0", "--json"]
ROOT = Path(__file__).resolve().parents[1]
TINY = ["simulate", str(ROOT / "examples" / "debug-tiny.yaml"), "--json", "--no-ablation"]
RING_256 = ["collective", "--ranks", "256", "--json"]
BIG_TABLE = ["simulate", str(ROOT / "examples" / "llama3-405b-65536xh200.yaml")]
COMMANDS = (["--version"], ["algorithms"], ["--help"], RING_4096, TINY, RING_256)
TARGETS = {"--version": 0.2, "algorithms": 0.2, "collective --op": 0.5, "simulate": 0.3, "collective --ranks": 0.25,
           "big": 10.0}
"""Seconds, whole process (issue "schedules that scale as their structure"; issue 33: the small jobs, the 65,536-GPU
table with ``--big``); ``--help`` has none."""


FLOOR = {"python": "pass", "import numpy": "import numpy", "import numpy, typer.main": "import numpy, typer.main"}
"""What any verb that computes pays before lightrail: the interpreter, numpy, Typer (``floor`` in the JSON)."""


def target(argv: list[str]) -> float | None:
    return TARGETS.get(argv[0]) or TARGETS.get(" ".join(argv[:2]))


def lightrail_command() -> list[str]:
    """The installed ``lightrail`` script beside this interpreter, else ``python -m lightrail.cli``."""
    script = Path(sys.executable).with_name("lightrail")
    if script.exists():
        return [str(script)]
    found = shutil.which("lightrail")
    return [found] if found else [sys.executable, "-m", "lightrail.cli"]


ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "COLUMNS": "120"}
"""The processes' environment: bytecode is cached as on a user's machine (with PYTHONDONTWRITEBYTECODE set, every
module edited since its last compile is compiled again in every run, ~0.1 s after a change to many modules), and
one untimed run per command (:func:`wall_times`) writes it."""


def wall_times(argv: list[str], runs: int, cpu: list[float] | None = None, *, warm: bool = True) -> list[float]:
    """Wall seconds of ``runs`` fresh processes, after one untimed run that caches the bytecode (``warm``); their
    CPU seconds (user + system, the process's and its forked workers') go to ``cpu`` when given: on a shared
    machine CPU time moves much less with the load than wall time does."""
    if warm:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times


def import_times(module: str = "lightrail.cli", top: int = 10) -> dict:
    """``-X importtime`` of ``import module``: its total and the ``top`` largest cumulative imports (us)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], check=True,
                          capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        rows.append({"module": name.strip(), "depth": (len(name) - len(name.lstrip())) // 2,
                     "cumulative_us": int(cumulative_us), "self_us": int(self_us)})
    total = next((r["cumulative_us"] for r in rows if r["module"] == module), None)
    largest = sorted((r for r in rows if r["module"] != module), key=lambda r: -r["cumulative_us"])[:top]
    return {"module": module, "total_us": total, "modules_imported": len(rows), "top": largest}


def imports_numpy(argv: list[str]) -> bool:
    """Whether ``lightrail <argv>`` imports numpy (``-X importtime`` of the whole command)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "lightrail.cli", *argv], check=True,
                          capture_output=True, text=True)
    return any(line.rstrip().endswith("| numpy") for line in done.stderr.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="Processes per command (default 9).")
    parser.add_argument("--big", action="store_true", help="Also time the 65,536-GPU example's default table "
                        "(simulate with the ablation; minutes): once.")
    args = parser.parse_args()
    base = lightrail_command()
    commands = []
    for argv in COMMANDS:
        cpu: list[float] = []
        times = wall_times([*base, *argv], args.runs, cpu)
        commands.append({"command": " ".join(["lightrail", *argv]).replace(str(ROOT) + "/", ""), "runs": args.runs,
                         "best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
                         "best_cpu_s": round(min(cpu), 3), "median_cpu_s": round(statistics.median(cpu), 3),
                         "target_s": target(argv)})
    if args.big:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            cpu = []
            times = wall_times([*base, *BIG_TABLE, "--out", tmp], 1, cpu, warm=False)  # minutes: run once
        commands.append({"command": " ".join(["lightrail", *BIG_TABLE]).replace(str(ROOT) + "/", ""), "runs": 1,
                         "best_s": round(times[0], 2), "median_s": round(times[0], 2), "best_cpu_s": round(cpu[0], 2),
                         "median_cpu_s": round(cpu[0], 2), "target_s": TARGETS["big"]})
    floor = {}
    for name, code in FLOOR.items():
        cpu = []
        times = wall_times([sys.executable, "-c", code], args.runs, cpu)
        floor[name] = {"median_s": round(statistics.median(times), 3), "best_s": round(min(times), 3),
                       "median_cpu_s": round(statistics.median(cpu), 3)}
    out = {"machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                       "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
           "launcher": base, "python_startup_best_s": floor["python"]["best_s"], "floor": floor,
           "pythondontwritebytecode_in_env": "PYTHONDONTWRITEBYTECODE" in os.environ,
           "commands": commands, "import_lightrail_cli": import_times(),
           "algorithms_imports_numpy": imports_numpy(["algorithms"])}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
