"""Scale benchmark: generate + verify + time AllReduce at N = 256 .. 65,536 ranks (powers of 4).

Per (algorithm, topology, N): in-process wall time of ``studies.collective.evaluate`` (the compressed
path where the algorithm has one for N, else the explicit schedule, which for the double binary tree is
linear in N and proven by the tree proof at large N), and, in a fresh process, wall time and peak RSS of
the matching ``lightrail collective ... --json`` (measured by ``/usr/bin/time``). The contract: ring
AllReduce on a ring at 65,536 ranks equals the closed form ``2(N-1)(L + size/N/B)``. Prints one JSON
object: the rows, then ``goals`` (each goal of the issue "schedules that scale as their structure", its
measured value and whether it is met) and ``memory`` (peak RSS above the smallest run's, per algorithm on a
switch, and its growth per 4x ranks: 4 is linear, 16 quadratic). Asserts nothing about speed. A cell that
cannot run says so in ``skipped``.

Run: .venv/bin/python benchmarks/bench_scale.py [--quick] [--max 65536] [--explicit-max 65536] [--no-process]
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
    """Wall time, CPU time (user + system) and peak RSS of one CLI run, measured by /usr/bin/time (a small
    parent: a child forked from this process would report this process's RSS as its peak)."""
    argv = [*lightrail_command(), "collective", "--op", "allreduce", "--algo", algo, "--ranks", str(n),
            "--topology", topo, *ARGS]
    with tempfile.NamedTemporaryFile("r") as stats:
        timer = ["/usr/bin/time", "-o", stats.name, "-f", "%U %S %M"] if Path("/usr/bin/time").exists() else []
        start = time.perf_counter()
        done = subprocess.run([*timer, *argv], capture_output=True, env={**os.environ, "COLUMNS": "120"})
        wall = time.perf_counter() - start
        line = stats.read().split()
    row = {"wall_s": wall}
    if len(line) >= 3:  # CPU seconds move much less than wall time with the load of a shared machine
        row["cpu_s"] = round(float(line[-3]) + float(line[-2]), 2)
        row["max_rss_MiB"] = int(line[-1]) / 1024  # %M is KiB
    if done.returncode:
        row["error"] = f"exit {done.returncode}: {done.stderr.decode()[-300:]}"
    else:
        row["time_s"] = json.loads(done.stdout)["time_s"]
    return row


def goals(rows: list[dict]) -> list[dict]:
    """The issue's goals against the measured rows (None where the cell did not run)."""
    cell = {(r["algorithm"], r["topology"], r["ranks"]): r for r in rows}

    def get(algo, topo, n, where, key):
        return cell.get((algo, topo, n), {}).get(where, {}).get(key)

    wanted = [("ring AllReduce, 65,536 ranks on a ring: whole process", ("ring", "ring", 65536, "process", "wall_s"),
               10.0),
              ("ring AllReduce, 65,536 ranks on a ring: peak RSS (MiB)",
               ("ring", "ring", 65536, "process", "max_rss_MiB"), 2048.0),
              ("ring AllReduce, 4,096 ranks on a ring: whole process",
               ("ring", "ring", 4096, "process", "wall_s"), 0.5),
              ("halving-doubling, 1,024 ranks on a switch: whole process",
               ("halving-doubling", "switch", 1024, "process", "wall_s"), 0.2),
              ("halving-doubling, 1,024 ranks on a switch: in process",
               ("halving-doubling", "switch", 1024, "in_process", "wall_s"), 0.2)]
    wanted += [(f"{text.replace('whole process', 'whole process, CPU seconds')}", (*key[:4], "cpu_s"), limit)
               for text, key, limit in wanted if key[3:] == ("process", "wall_s")]
    out = []
    for text, key, limit in wanted:
        value = get(*key)
        out.append({"goal": text, "limit": limit, "measured": value, "met": None if value is None else value < limit})
    return out


def memory(rows: list[dict]) -> dict:
    """Peak RSS of the whole process above the smallest of its runs (the start-up footprint, MiB), per algorithm
    on a switch, and how much it grows per 4x ranks (4: linear in N, 16: quadratic)."""
    out = {}
    for algo in ALGOS:
        rss = {r["ranks"]: r["process"]["max_rss_MiB"] for r in rows
               if r["algorithm"] == algo and r["topology"] == "switch" and "max_rss_MiB" in r.get("process", {})}
        if not rss:
            continue
        base = min(rss.values())
        above = {n: round(rss[n] - base, 1) for n in sorted(rss)}
        growth = {f"{n // 4}->{n}": round(above[n] / above[n // 4], 2) for n in above
                  if n // 4 in above and above[n // 4] > 8}  # below 8 MiB the footprint's noise dominates
        out[algo] = {"rss_above_footprint_MiB": above, "growth_per_4x": growth}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 256 and 1,024 only")
    parser.add_argument("--max", type=int, default=65536, help="largest N (powers of 4 from 256)")
    parser.add_argument("--explicit-max", type=int, default=65536, help="largest N run on explicit schedules")
    parser.add_argument("--no-process", action="store_true", help="skip the whole-process runs")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from lightrail.collectives.compressed import compressed_form

    largest = 1024 if args.quick else args.max
    sizes = [n for n in (256, 1024, 4096, 16384, 65536) if n <= largest]
    rows = []
    for algo in ALGOS:
        for topo in TOPOLOGIES:
            for n in sizes:
                row = {"algorithm": algo, "topology": topo, "ranks": n}
                if compressed_form("allreduce", algo, n) is None and n > args.explicit_max:
                    rows.append({**row, "skipped": f"explicit schedule above {args.explicit_max} ranks"})
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
                      "load_average": os.getloadavg(), "size_bytes": SIZE, "bandwidth_Bps": BW, "latency_s": LAT,
                      "rows": rows, "goals": goals(rows), "memory": memory(rows)}, indent=2))


if __name__ == "__main__":
    main()
