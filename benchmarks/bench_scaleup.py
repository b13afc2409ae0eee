"""Time the scale-up study at the issue's scale (1,000 racks, 100,000 requests); prints JSON, asserts nothing.

    .venv/bin/python benchmarks/bench_scaleup.py [--racks 1000] [--requests 100000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time

from lightrail.studies.scaleup import ScaleupParams, scaleup_study


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--racks", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = scaleup_study(ScaleupParams(racks=args.racks, requests=args.requests, seed=args.seed))
    wall = time.perf_counter() - t0
    print(json.dumps({
        "racks": args.racks, "requests": args.requests, "seed": args.seed, "wall_s": wall,
        **{fab: {"elapsed_s": o.elapsed_s, "acceptance": o.acceptance, "fragmentation": o.fragmentation,
                 "stranded_fraction": o.stranded_fraction, "mean_slice_bandwidth_Bps": o.mean_slice_bandwidth_Bps,
                 "failures_hit": o.failure_recovery.hit}
           for fab, o in (("electrical", result.electrical), ("photonic", result.photonic))},
    }, indent=2))


if __name__ == "__main__":
    main()
