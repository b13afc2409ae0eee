"""StragglAR AllReduce measured for real on 8 CPU gloo processes, with one rank arriving late, against
lightrail's Ring and gloo's dist.all_reduce, per buffer size. Prints one JSON object; asserts nothing
about speed. Writes out/bench/stragglar-run.json and out/bench/stragglar-run.png.

Run: .venv/bin/python benchmarks/bench_stragglar_run.py [--straggler-delay 50ms] [--sizes 1MiB,4MiB] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lightrail.report.files import write_json
from lightrail.report.plots import plot_straggler_run
from lightrail.studies.stragglar_run import measure_stragglar
from lightrail.units import format_size, format_time, parse_size, parse_time

RANKS = 8
OUT = Path("out/bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--straggler-delay", "--delay", dest="delay", default="50ms",
                        help="how late the straggler (rank 7) arrives (--delay: the old spelling)")
    parser.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB", help="comma list of buffer sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed trials per method and size (median)")
    args = parser.parse_args()
    delay_s = parse_time(args.delay, field="--straggler-delay")
    sizes = [int(parse_size(s, field="--sizes")) for s in args.sizes.split(",") if s.strip()]
    rows = []
    start = time.perf_counter()
    for size in sizes:
        t0 = time.perf_counter()
        r = measure_stragglar(RANKS, size, delay_s, RANKS - 1, repeats=args.repeats).to_dict()
        rows.append({"size": format_size(size), "size_bytes": size, "delay_s": r["delay_s"],
                     "stragglar_s": round(r["stragglar_s"], 5), "ring_s": round(r["ring_s"], 5),
                     "native_s": round(r["native_s"], 5),
                     "speedup_over_native": round(r["speedup_over_native"], 3),
                     "speedup_over_ring": round(r["speedup_over_ring"], 3),
                     "trials_s": {m: [round(t, 5) for t in v] for m, v in r["trials_s"].items()},
                     "correct": r["correct"], "wall_s": round(time.perf_counter() - t0, 1)})
        print(f"{format_size(size)}: done in {rows[-1]['wall_s']} s", file=sys.stderr)
    out = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "numpy": np.__version__,
                    "torch": torch.__version__, "cpus": os.cpu_count()},
        "ranks": RANKS, "straggler": RANKS - 1, "delay_s": delay_s, "repeats": args.repeats, "warmup": 1,
        "backend": "gloo", "rows": rows, "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(OUT / "stragglar-run.json", out)
    plot_straggler_run(rows, OUT / "stragglar-run.png",
                       f"AllReduce on {RANKS} CPU gloo processes, rank {RANKS - 1} {format_time(delay_s)} late "
                       f"(median of {args.repeats})")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
