"""Flow-level sharing's price: the simulators with ops sharing links (``engine.sharing: fair``, the default)
against each op timed alone (``none``, the model before), and :class:`lightrail.sharing.FairShare` on its own.

Prints one JSON object:
- ``iteration``: wall seconds of one photonic iteration (steady state) of the default scenario (2,048 GPUs) and
  of the 65,536-GPU example, with sharing fair and none, and the simulated iteration times;
- ``fair_share``: events per second of FairShare on ``--flows`` random ops over 1,000 links (8 links each, every
  op starting while about 50 others run): an adversarial case where nearly every op shares a link with another,
  so every start and end re-rates a component of dozens of ops (a training iteration's are of one or two).

Run: .venv/bin/python benchmarks/bench_sharing.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from lightrail.scenario import load_scenario
from lightrail.sharing import FairShare, OpCost
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload.program import build_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def iteration(built, sharing: str) -> tuple[float, float]:
    """Wall seconds and simulated seconds of one photonic iteration under the scenario's policy."""
    fabric = replace(built.fabric, sharing=sharing)
    program = build_program(built.job, defer_dp=built.params.defer_dp)
    start = time.perf_counter()
    result = simulate_iteration(program, fabric, built.params)
    return time.perf_counter() - start, result.iteration_time_s


def fair_share(flows: int, seed: int = 0) -> dict:
    """``flows`` ops on 8 random links of 1,000 each, started 1 ms apart (each about 50 ms long), run to the end."""
    rng = np.random.default_rng(seed)
    share = FairShare()
    starts = np.arange(flows) * 1e-3
    events = 0
    t0 = time.perf_counter()
    i = 0
    while i < flows or len(share):
        nxt = share.next_finish()
        if i < flows and (nxt is None or starts[i] <= nxt[0]):
            links = rng.choice(1000, 8, replace=False)
            seconds = rng.uniform(0.02, 0.08)
            share.start(i, OpCost(seconds, links, seconds * rng.uniform(0.2, 1.0, 8)), float(starts[i]))
            i += 1
        else:
            share.finish(nxt[1], nxt[0])
        events += 1
    wall = time.perf_counter() - t0
    return {"flows": flows, "events": events, "wall_s": round(wall, 3), "events_per_s": round(events / wall)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 65,536-GPU example")
    parser.add_argument("--flows", type=int, default=5000)
    args = parser.parse_args()
    cases = {"default_2048": load_scenario(None)[0].build()}
    if not args.quick:
        cases["huge_65536"] = load_scenario(EXAMPLES / "llama3-405b-65536xh200.yaml")[0].build()
    out: dict = {"iteration": {}}
    iteration(cases["default_2048"], "fair")  # warm-up: imports and first-use caches
    for name, built in cases.items():
        row = {}
        for sharing in ("none", "fair"):
            wall, simulated = iteration(built, sharing)
            row[sharing] = {"wall_s": round(wall, 3), "iteration_time_s": simulated}
        row["wall_ratio"] = round(row["fair"]["wall_s"] / row["none"]["wall_s"], 2)
        out["iteration"][name] = row
    out["fair_share"] = fair_share(args.flows)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
