"""Time the collaborative-ML study at the issue's scale (10,000 clients, 20 jobs, all five policies); prints
JSON (wall time per policy, simulated events per second, the metrics), asserts nothing.

    .venv/bin/python benchmarks/bench_fl.py [--clients 10000] [--jobs 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time

from lightrail.fl.policies import POLICIES
from lightrail.fl.population import synthetic_population
from lightrail.studies.fl import CONTRACT, FlParams, run_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    params = FlParams(clients=args.clients, jobs=args.jobs, seed=args.seed)
    t0 = time.perf_counter()
    pop = synthetic_population(params.clients, params.jobs, seed=params.seed, horizon_s=params.horizon_s,
                               job_gap_s=params.job_gap_s)
    population_s = time.perf_counter() - t0
    per = {}
    for p in POLICIES:
        o = run_policy(pop, p, params)
        per[p.value] = {"wall_s": o.elapsed_s, "events": o.events, "events_per_s": o.events_per_s,
                        **{k: getattr(o, k) for k in CONTRACT},
                        "jobs_completed": o.jobs_completed, "makespan_s": o.makespan_s, "lost": o.lost}
    print(json.dumps({"clients": args.clients, "jobs": args.jobs, "seed": args.seed, "sessions": len(pop.session_start),
                      "population_s": population_s, "wall_s": time.perf_counter() - t0, "policies": per}, indent=2))


if __name__ == "__main__":
    main()
