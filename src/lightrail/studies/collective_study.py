"""When does reconfiguring the fabric pay? The collective study over ops, rank counts, sizes and delays.

Per (op, n): every algorithm is timed on three static fabrics (bidirectional ring, 2D torus,
electrical switch) and planned exactly on a reconfigurable one (``ports`` optical ports per GPU,
starting from the same bidirectional ring), for all sizes and delays at once. Per cell the study
reports the best static choice, the best reconfigurable choice and the speedup, and it derives the
statements the short-circuiting and PCCL papers make from the model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lightrail.collectives import algorithms
from lightrail.control.pccl import Planner
from lightrail.fabric.builders import NIC_BANDWIDTH, ring, square_shape, switch, torus
from lightrail.fabric.params import ReconfigurableFabric
from lightrail.timing import Engine

__all__ = ["StudyGrid", "collective_study", "EXCLUDED"]

EXCLUDED = {("allreduce", "direct"): 256, ("alltoall", "pairwise"): 256, ("allreduce", "stragglar"): 0}
"""(op, algorithm) -> largest n studied. Direct and pairwise: n-1 circuits per GPU never fit the ports,
so these only run on their initial circuits, and routing n^2 pairs over long multi-hop paths is what
dominates the study's cost; they are never competitive at that scale. StragglAR only pays off when a
straggler hides its phase 1, which this study has none of (``lightrail stragglar compare`` does)."""


@dataclass(frozen=True, kw_only=True)
class StudyGrid:
    ops: tuple[str, ...] = ("allreduce", "reducescatter", "allgather", "alltoall")
    ranks: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 1024)
    sizes: tuple[float, ...] = tuple(float(2**k) for k in range(10, 33))
    delays: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
    ports: int = 2
    bandwidth: float = NIC_BANDWIDTH
    latency: float = 1e-6
    propagation: float = 0.0
    alpha: float = 3e-6
    states: dict = field(default_factory=lambda: {"max_states": 16})


def _static_times(engine: Engine, schedule, sizes: np.ndarray, alpha: float) -> np.ndarray:
    """Total time of ``schedule`` for every size (vector), reusing the step models of identical steps."""
    cb = sizes / schedule.collective.chunks_per_buffer
    total = np.zeros(len(sizes))
    counts: dict[int, tuple] = {}
    for model in engine.profile(schedule):
        entry = counts.setdefault(id(model), [model, 0])
        entry[1] += 1
    for model, k in counts.values():
        if len(model.latency):
            total += k * (alpha + np.max(model.latency[:, None] + model.per_byte[:, None] * cb[None, :], axis=0))
    return total


def collective_study(grid: StudyGrid = StudyGrid(), *, progress: Callable[[str], None] | None = None) -> dict:
    """Run the grid; returns cells, per-(op, n) tables and the derived findings (JSON-ready)."""
    sizes, delays = np.array(grid.sizes), np.array(grid.delays)
    cells, tables, excluded = [], {}, []
    for op in grid.ops:
        for n in grid.ranks:
            algos = [a for a in algorithms(op) if a.supports(n)]
            kept = [a for a in algos if n <= EXCLUDED.get((op, a.name), n)]
            excluded += [{"op": op, "ranks": n, "algorithm": a.name} for a in algos if a not in kept]
            schedules = {a.name: a(n) for a in kept}
            static = {}
            for name, topo in (("ring", ring(n, bandwidth=grid.bandwidth, latency=grid.latency)),
                               ("torus", torus(square_shape(n, 2), bandwidth=grid.bandwidth, latency=grid.latency)),
                               ("switch", switch(n, bandwidth=grid.bandwidth, latency=grid.latency))):
                engine = Engine(topo, alpha=grid.alpha)
                static[name] = {a: _static_times(engine, s, sizes, grid.alpha) for a, s in schedules.items()}
            fabric = ReconfigurableFabric(n=n, ports=grid.ports, bandwidth=grid.bandwidth, latency=grid.latency,
                                          propagation=grid.propagation, alpha=grid.alpha)
            reconf, exact = {}, True
            for a, s in schedules.items():
                planner = Planner(s, fabric, **grid.states)
                reconf[a] = planner.totals(sizes, delays)
                exact &= planner.exact
            tables[(op, n)] = {"static": static, "reconfigurable": reconf}
            for di, d in enumerate(delays):
                for si, size in enumerate(sizes):
                    best_static = {f: min(((t[si], a) for a, t in times.items()), key=lambda x: x[0])
                                   for f, times in static.items()}
                    r_time, r_algo = min((v[0][di, si], a) for a, v in reconf.items())
                    ring_time = best_static["ring"][0]
                    overall = min(best_static.values(), key=lambda x: x[0])
                    cells.append({
                        "op": op, "ranks": n, "size_bytes": size, "delay_s": d,
                        "best_static": {f: {"algorithm": a, "time_s": t} for f, (t, a) in best_static.items()},
                        "best_reconfigurable": {"algorithm": r_algo, "time_s": r_time,
                                                "reconfigurations": int(reconf[r_algo][1][di, si]),
                                                "exact": exact},
                        "speedup_vs_static_ring": ring_time / r_time,
                        "speedup_vs_best_static": overall[0] / r_time,
                    })
            if progress:
                progress(f"{op} n={n}")
    return {"grid": {"ops": list(grid.ops), "ranks": list(grid.ranks), "sizes": list(grid.sizes),
                     "delays": list(grid.delays), "ports": grid.ports, "alpha_s": grid.alpha,
                     "latency_s": grid.latency, "propagation_s": grid.propagation, "bandwidth_Bps": grid.bandwidth},
            "excluded": excluded, "cells": cells, "findings": _findings(grid, tables), "_tables": tables}


def _findings(grid: StudyGrid, tables: dict) -> list[dict]:
    """The three statements the study must show (or refute), per rank count, from the model."""
    sizes, delays = np.array(grid.sizes), np.array(grid.delays)
    out = []
    for (op, n), t in tables.items():
        if op != "allreduce" or "ring" not in t["static"]["ring"]:
            continue
        ring_on_ring = t["static"]["ring"]["ring"]
        rd_on_ring = t["static"]["ring"].get("recursive-doubling")
        if rd_on_ring is not None:
            wins = np.flatnonzero(ring_on_ring < rd_on_ring)
            out.append({"finding": "static ring: Ring AllReduce vs recursive doubling", "ranks": n,
                        "ring_wins_from_bytes": float(sizes[wins[0]]) if len(wins) else None,
                        "ring_wins_at_smallest_size": bool(ring_on_ring[0] < rd_on_ring[0]),
                        "ratio_rd_over_ring_at_smallest": float(rd_on_ring[0] / ring_on_ring[0])})
            rd_reconf = t["reconfigurable"]["recursive-doubling"][0]  # (delays, sizes)
            beats = rd_reconf < ring_on_ring[None, :]
            out.append({"finding": "short-circuited recursive doubling vs Ring on the static ring", "ranks": n,
                        "static_wins_up_to_size": _largest(sizes, rd_on_ring < ring_on_ring),
                        "wins_up_to_size_by_delay": {f"{d:g}": _largest(sizes, beats[i])
                                                     for i, d in enumerate(delays)}})
        best_static = np.min([v for v in t["static"]["ring"].values()], axis=0)
        best_reconf = np.min([v[0] for v in t["reconfigurable"].values()], axis=0)
        pays = best_reconf < best_static[None, :] * (1 - 1e-9)
        out.append({"finding": "where reconfiguration stops paying (vs the best algorithm on the static ring)",
                    "ranks": n, "largest_paying_delay_by_size": {f"{int(s)}": _largest(delays, pays[:, i])
                                                                 for i, s in enumerate(sizes)}})
    return out


def _largest(values: Sequence[float], mask: np.ndarray) -> float | None:
    hits = np.flatnonzero(mask)
    return float(np.asarray(values)[hits[-1]]) if len(hits) else None
