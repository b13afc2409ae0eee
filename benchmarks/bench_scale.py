"""Scale benchmark: generate + verify + time AllReduce at N = 256 .. 65,536 ranks (powers of 4).

Per (algorithm, topology, N): in-process wall time of ``studies.collective.evaluate`` (the compressed
path where the algorithm has one for N, else the explicit schedule: explicit cases only up to
``--explicit-max`` ranks, beyond that they would run out of memory), and, in a fresh process, wall time
and peak RSS of the matching ``lightrail collective ... --json`` (``os.wait4``'s rusage of that child).
The contract: ring AllReduce on a ring at 65,536 ranks equals the closed form
``2(N-1)(L + size/N/B)``. Prints one JSON object; asserts nothing about speed. Goals (issue "schedules
that scale as their structure"): ring at 65,536 under 10 s and 2 GiB whole process, at 4,096 under
0.5 s; halving-doubling at 1,024 on a switch under 0.2 s.

Run: .venv/bin/python benchmarks/bench_scale.py [--max 65536] [--explicit-max 4096] [--no-process]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALGOS = ("ring", "halving-doubling", "double-binary-tree")
TOPOLOGIES = ("ring", "switch", "rails")
SIZE, BW, LAT = 2**30, 50e9, 500e-9
ARGS = ("--size", "1GiB", "--bandwidth", "50GBps", "--latency", "500ns", "--alpha", "0", "--json")


def lightrail_command() -> list[str]:
    script = Path(sys.executable).with_name("lightrail")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lightrail.cli"]


def closed_form_ring(n: int) -> float:
    return 2 * (n - 1) * (LAT + SIZE / n / BW)


def in_process(algo: str, topo: str, n: int) -> dict:
    from lightrail.collectives.compressed import compressed_form
    from lightrail.fabric.builders import build_topology
    from lightrail.studies.collective import evaluate

    path = "compressed" if compressed_form("allreduce", algo, n) is not None else "explicit"
    start = time.perf_counter()
    topology = build_topology(topo, n, bandwidth=BW, latency=LAT)
    result = evaluate("allreduce", algo, n, SIZE, topology, alpha=0.0)
    return {"path": path, "wall_s": time.perf_counter() - start, "time_s": result.time_s,
            "verification": result.verification}


def measured(algo: str, topo: str, n: int) -> dict:
    """Wall time and peak RSS of one CLI run, measured by /usr/bin/time (a small parent: a child forked
    from this process would report this process's RSS as its peak)."""
    argv = [*lightrail_command(), "collective", "--op", "allreduce", "--algo", algo, "--ranks", str(n),
            "--topology", topo, *ARGS]
    with tempfile.NamedTemporaryFile("r") as stats:
        timer = ["/usr/bin/time", "-o", stats.name, "-f", "%e %M"] if Path("/usr/bin/time").exists() else []
        start = time.perf_counter()
        done = subprocess.run([*timer, *argv], capture_output=True, env={**os.environ, "COLUMNS": "120"})
        wall = time.perf_counter() - start
        line = stats.read().split()
    row = {"wall_s": wall}
    if len(line) >= 2:
        row["max_rss_MiB"] = int(line[-1]) / 1024  # %M is KiB
    if done.returncode:
        row["error"] = f"exit {done.returncode}: {done.stderr.decode()[-300:]}"
    else:
        row["time_s"] = json.loads(done.stdout)["time_s"]
    return row


def _route_limit(algo: str, topo: str, n: int) -> str | None:
    """Cases the engine's route() cannot take yet: it walks every hop of every pair, so pairs n/2 hops apart on
    a ring cost n pairs x n/2 hops (switches and rails take their last hop from an index, so they scale)."""
    if topo == "ring" and algo != "ring" and n > 4096:
        return "route(): n pairs x up to n/2 hops"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=65536, help="largest N (powers of 4 from 256)")
    parser.add_argument("--explicit-max", type=int, default=4096, help="largest N run on explicit schedules")
    parser.add_argument("--no-process", action="store_true", help="skip the whole-process runs")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from lightrail.collectives.compressed import compressed_form

    sizes = [n for n in (256, 1024, 4096, 16384, 65536) if n <= args.max]
    rows = []
    for algo in ALGOS:
        for topo in TOPOLOGIES:
            for n in sizes:
                row = {"algorithm": algo, "topology": topo, "ranks": n}
                if compressed_form("allreduce", algo, n) is None and n > args.explicit_max:
                    rows.append({**row, "skipped": f"explicit schedule above {args.explicit_max} ranks"})
                    continue
                too_big = _route_limit(algo, topo, n)
                if too_big:
                    rows.append({**row, "skipped": too_big})
                    continue
                row["in_process"] = in_process(algo, topo, n)
                if not args.no_process:
                    row["process"] = measured(algo, topo, n)
                if algo == "ring" and topo == "ring":
                    row["closed_form_s"] = closed_form_ring(n)
                    row["equals_closed_form"] = abs(row["in_process"]["time_s"] / row["closed_form_s"] - 1) < 1e-12
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                      "size_bytes": SIZE, "bandwidth_Bps": BW, "latency_s": LAT, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
