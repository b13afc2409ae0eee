"""lightrail side by side with ASTRA-sim's analytical backend: the same collective on the same topology,
simulated time and wall time of each, in one JSON table (docs/astra-sim.md explains the cost terms).

ASTRA-sim is not part of lightrail and no script here builds it: build its analytical backend
(congestion-unaware) from its public source by its own README, and pass the binary::

    python benchmarks/vs_astra_sim.py --astra-sim PATH/AstraSim_Analytical_Congestion_Unaware
    python benchmarks/vs_astra_sim.py --astra-sim PATH --ranks 8,64,256 --size 1GiB --terms astra
    python benchmarks/vs_astra_sim.py --astra-sim PATH --cases allreduce:ring:ring:4,alltoall:ring:ring

Without ``--astra-sim`` (or ``$ASTRA_SIM``) only lightrail's side is printed.

Configured alike:
- ASTRA-sim's network config gives bandwidth in "GB/s" of 2**30 bytes (its analytical backend turns GB/s
  into bytes per ns with 2**30 / 1e9); this script converts lightrail's bytes per second exactly;
- ``--terms none``: ASTRA-sim's local reduction memory traffic made negligible (``local-mem-bw`` 1e9 GB/s) and
  its endpoint delay 1 ns (0 trips an assertion in its event queue), lightrail with no extra terms;
- ``--terms astra``: ASTRA-sim's example values (``endpoint-delay`` 10 ns, ``local-mem-bw`` 1600 GB/s), and
  lightrail's optional engine terms set to the same (``Engine(endpoint_delay=..., local_mem_bw=...)``).
ASTRA-sim runs the ``baseline`` collective optimisation with ``active-chunks-per-dimension`` 1, so it executes the
textbook algorithm lightrail generates; a case ``op:algorithm:topology:K`` sets ``preferred-dataset-splits`` K
(default 1), which lightrail times as ``Engine.time(..., splits=K)``: K chunks of size/K one after another.
All-to-all runs ASTRA-sim's ``all-to-all-implementation`` of the case's algorithm (``ring``: its ``Ring`` with
``All_to_All``, lightrail's ``alltoall`` ``ring``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightrail.collectives import generate
from lightrail.collectives.collective import Kind
from lightrail.fabric import builders
from lightrail.timing import Engine
from lightrail.units import parse_size, parse_time
from lightrail.workload.chakra import TraceNode, encode_rank

ASTRA_GB = 2**30
"""Bytes in ASTRA-sim's "GB" of bandwidth (analytical backend: ``bw * 2**30 / 1e9`` bytes per ns)."""

TOPOLOGIES = {"ring": ("Ring", builders.ring), "switch": ("Switch", builders.switch)}
ALGORITHMS = {"ring": "ring", "halving-doubling": "halvingDoubling", "double-binary-tree": "doubleBinaryTree",
              "direct": "direct"}
ASTRA_OP = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
            "alltoall": "all-to-all"}
LARGEST = {("alltoall", "ring"): 256}
"""Most ranks a case runs at: the ring all-to-all's explicit schedule holds n^2(n-1)/2 transfers (0.5 billion at
1,024 ranks, more than this machine holds), and ASTRA-sim sends as many messages."""
TERMS = {"none": (1e-9, 1e18), "astra": (10e-9, 1600e9)}
"""--terms: (endpoint delay s, local memory bytes/s) given to both simulators."""

_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")


def astra_inputs(folder: Path, *, op: str, algo: str, ranks: int, size: float, topology: str, bandwidth: float,
                 latency: float, endpoint_delay: float, local_mem_bw: float, splits: int = 1) -> list[str]:
    """Write ASTRA-sim's four inputs for one collective; returns its command-line flags."""
    folder.mkdir(parents=True, exist_ok=True)
    # ASTRA-sim's all-gather comm_size is each rank's contribution (it moves (n-1) x comm_size per rank);
    # lightrail's size is the whole gathered buffer, as for the other collectives
    nbytes = size / ranks if op == "allgather" else size
    node = TraceNode(id=0, name=op, op="collective", kind=Kind(op), nbytes=nbytes)
    for rank in range(ranks):
        (folder / f"workload.{rank}.et").write_bytes(encode_rank([node], rank))
    (folder / "network.yml").write_text(
        f"topology: [ {TOPOLOGIES[topology][0]} ]\nnpus_count: [ {ranks} ]\n"
        f"bandwidth: [ {bandwidth / ASTRA_GB!r} ]\nlatency: [ {latency * 1e9!r} ]\n")
    impl = ALGORITHMS[algo]
    system = {"scheduling-policy": "LIFO", "endpoint-delay": round(endpoint_delay * 1e9),
              "active-chunks-per-dimension": 1, "preferred-dataset-splits": splits,
              "all-reduce-implementation": [impl], "all-gather-implementation": [impl],
              "reduce-scatter-implementation": [impl],
              "all-to-all-implementation": [impl if op == "alltoall" else "direct"],
              "collective-optimization": "baseline", "local-mem-bw": local_mem_bw / 1e9, "boost-mode": 0,
              "roofline-enabled": 0}
    (folder / "system.json").write_text(json.dumps(system))
    (folder / "memory.json").write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}))
    return [f"--workload-configuration={folder / 'workload'}", f"--system-configuration={folder / 'system.json'}",
            f"--remote-memory-configuration={folder / 'memory.json'}",
            f"--network-configuration={folder / 'network.yml'}"]


def run_astra(binary: str, flags: list[str], ranks: int) -> tuple[float, float]:
    """(simulated seconds: the last rank to finish, wall seconds) of one ASTRA-sim run."""
    start = time.perf_counter()
    workdir = Path(flags[0].split("=", 1)[1]).parent  # its log/ folder goes beside the inputs, not into the cwd
    proc = subprocess.run([binary, *flags], capture_output=True, text=True, timeout=3600, cwd=workdir)
    wall = time.perf_counter() - start
    ends = {int(r): int(c) for r, c in _FINISHED.findall(proc.stdout + proc.stderr)}
    if proc.returncode != 0 or len(ends) != ranks:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise RuntimeError(f"ASTRA-sim failed (exit {proc.returncode}): {' | '.join(tail)}")
    return max(ends.values()) * 1e-9, wall  # cycles are ns


def run_lightrail(*, op: str, algo: str, ranks: int, size: float, topology: str, bandwidth: float, latency: float,
                  endpoint_delay: float, local_mem_bw: float, splits: int = 1) -> tuple[float, float]:
    """(simulated seconds, wall seconds in this process: generate + route + time)."""
    start = time.perf_counter()
    topo = TOPOLOGIES[topology][1](ranks, bandwidth=bandwidth, latency=latency)
    engine = Engine(topo, endpoint_delay=endpoint_delay, local_mem_bw=local_mem_bw)
    t = engine.time(generate(op, algo, ranks), size, splits=splits).time_s
    return t, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--astra-sim", default=os.environ.get("ASTRA_SIM"), help="ASTRA-sim analytical binary")
    p.add_argument("--ranks", default="8,64,256,1024")
    p.add_argument("--size", default="1GiB")
    p.add_argument("--bandwidth", default="50e9", help="bytes/s per link")
    p.add_argument("--latency", default="500ns")
    p.add_argument("--terms", choices=sorted(TERMS), default="none")
    p.add_argument("--cases", default="allreduce:ring:ring,allreduce:ring:switch,allreduce:halving-doubling:switch,"
                   "allreduce:double-binary-tree:switch,allgather:ring:ring,reducescatter:ring:ring,"
                   "alltoall:ring:ring,allreduce:ring:ring:4,allreduce:halving-doubling:switch:4",
                   help="op:algorithm:topology[:splits],...")
    args = p.parse_args(argv)
    size, bandwidth = parse_size(args.size, field="--size"), float(args.bandwidth)
    latency = parse_time(args.latency, field="--latency")
    endpoint_delay, local_mem_bw = TERMS[args.terms]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-astra-") as tmp:
        for case in args.cases.split(","):
            op, algo, topology, *rest = case.split(":")
            splits = int(rest[0]) if rest else 1
            for ranks in (int(r) for r in args.ranks.split(",")):
                if ranks > LARGEST.get((op, algo), ranks):
                    continue
                common = dict(op=op, algo=algo, ranks=ranks, size=size, topology=topology, bandwidth=bandwidth,
                              latency=latency, endpoint_delay=endpoint_delay, local_mem_bw=local_mem_bw,
                              splits=splits)
                row = {"op": op, "algorithm": algo, "topology": topology, "ranks": ranks, "size": size,
                       "splits": splits, "terms": args.terms}
                row["lightrail_s"], row["lightrail_wall_s"] = run_lightrail(**common)
                if args.astra_sim:
                    flags = astra_inputs(Path(tmp) / f"{op}-{algo}-{topology}-{ranks}-{splits}", **common)
                    try:
                        row["astra_sim_s"], row["astra_sim_wall_s"] = run_astra(args.astra_sim, flags, ranks)
                        row["relative_difference"] = row["lightrail_s"] / row["astra_sim_s"] - 1
                        row["speedup_wall"] = row["astra_sim_wall_s"] / row["lightrail_wall_s"]
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        row["astra_sim_error"] = str(e)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "vs_astra_sim", "astra_sim": args.astra_sim or None, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
