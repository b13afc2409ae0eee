"""Time decentralized TE at the issue's scale (GEANT, 1,000 traffic matrices, 5 slices: 5,000 QP and 5,000 LP
solves); prints JSON with the timings and the headline means, asserts nothing.

    .venv/bin/python benchmarks/bench_te.py [--topology geant] [--matrices 1000] [--slices 5] [--lambda 0.01]
"""

from __future__ import annotations

import argparse
import json
import time

from lightrail.studies.te import DEFAULT_LAMBDA, TeSetup, make_slicings, prepare, run_te


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="geant")
    ap.add_argument("--matrices", type=int, default=1000)
    ap.add_argument("--slices", type=int, default=5)
    ap.add_argument("--lambda", dest="lam", type=float, default=DEFAULT_LAMBDA)
    ap.add_argument("--perturbation", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    setup = TeSetup(topology=args.topology, matrices=args.matrices, slices=args.slices, lam=args.lam,
                    perturbation=args.perturbation, seed=args.seed)
    t0 = time.perf_counter()
    net = prepare(setup)
    t1 = time.perf_counter()
    slicings = make_slicings(setup, net)
    t2 = time.perf_counter()
    run = run_te(setup, network=net, slicings=slicings)
    t3 = time.perf_counter()
    print(json.dumps({
        "topology": args.topology, "nodes": net.wan.n, "links": net.wan.links, "demands": net.paths.demands,
        "paths": net.paths.paths, "matrices": args.matrices, "slices": args.slices, "lambda": args.lam,
        "perturbation": args.perturbation, "solves": 2 * args.slices * args.matrices,
        "prepare_s": t1 - t0, "slicers_s": t2 - t1, "run_s": t3 - t2, "wall_s": t3 - t0,
        "per_matrix_ms": 1e3 * (t3 - t2) / args.matrices,
        "mean": {s: {c: run.mean(s, c) for c in ("regularized", "unregularized")} for s in slicings},
    }, indent=2))


if __name__ == "__main__":
    main()
