"""When does reconfiguring the fabric pay? The collective study over ops, rank counts, sizes and delays.

Per (op, n): every algorithm is timed on three static fabrics (bidirectional ring, 2D torus,
electrical switch) and planned exactly on a reconfigurable one (``ports`` optical ports per GPU,
starting from the same bidirectional ring), for all sizes and delays at once. Per cell the study
reports the best static choice, the best reconfigurable choice and the speedup, and it derives the
statements the short-circuiting and PCCL papers make from the model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field

import numpy as np

from lightrail.collectives import algorithms
from lightrail.control.pccl import Planner
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import NIC_BANDWIDTH, ring, square_shape, switch, torus
from lightrail.fabric.params import ALPHA, HOP_LATENCY, ReconfigurableFabric
from lightrail.timing import Engine

__all__ = ["StudyGrid", "CollectiveStudy", "collective_study", "EXCLUDED"]

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
    latency: float = HOP_LATENCY
    propagation: float = 0.0
    alpha: float = ALPHA
    states: dict = field(default_factory=lambda: {"max_states": 16})

    def __post_init__(self):
        if not self.ranks or min(self.ranks) < 2:
            raise ScenarioError(f"rank counts {list(self.ranks)}: each must be 2 or more", field="ranks",
                                fix="e.g. 8,64,1024")
        if self.ports < 1:
            raise ScenarioError(f"{self.ports} ports", field="ports", fix="use 1 or more")

    def to_dict(self) -> dict:
        return {"ops": list(self.ops), "ranks": list(self.ranks), "sizes": list(self.sizes),
                "delays": list(self.delays), "ports": self.ports, "alpha_s": self.alpha, "latency_s": self.latency,
                "propagation_s": self.propagation, "bandwidth_Bps": self.bandwidth}


CSV_COLUMNS = ("op", "ranks", "size_bytes", "delay_s", "static_ring", "static_ring_s", "static_torus",
               "static_torus_s", "switch", "switch_s", "reconfigurable", "reconfigurable_s", "reconfigurations",
               "speedup_vs_static_ring", "speedup_vs_best_static")
"""Columns of :meth:`CollectiveStudy.rows`, one flat row per cell."""


@dataclass(frozen=True, kw_only=True)
class CollectiveStudy:
    """The study's cells (one per op, n, size, delay), what it left out, and its findings.

    ``tables`` keeps, per (op, n), every algorithm's time on each static fabric (vector over sizes) and
    on the reconfigurable one ((times, reconfigurations), each delays x sizes)."""

    grid: StudyGrid
    excluded: tuple[dict, ...]
    cells: tuple[dict, ...]
    findings: tuple[dict, ...]
    tables: dict = field(repr=False, compare=False)

    def speedups(self, op: str) -> dict[int, np.ndarray]:
        """Per rank count, the best reconfigurable time's speedup over the best algorithm on the static
        ring, as an array (delays x sizes)."""
        out = {}
        for n in self.grid.ranks:
            t = self.tables[(op, n)]
            best_ring = np.min(list(t["static"]["ring"].values()), axis=0)
            best_reconf = np.min([v[0] for v in t["reconfigurable"].values()], axis=0)
            out[n] = best_ring[None, :] / best_reconf
        return out

    def best_cells(self) -> list[dict]:
        """Per (op, n), in grid order, the cell where reconfiguring gains the most over the static ring."""
        return [max((c for c in self.cells if c["op"] == op and c["ranks"] == n),
                    key=lambda c: c["speedup_vs_static_ring"])
                for op in self.grid.ops for n in self.grid.ranks]

    def rows(self) -> list[dict]:
        """One flat row per cell, keyed by :data:`CSV_COLUMNS`."""
        out = []
        for c in self.cells:
            st, rc = c["best_static"], c["best_reconfigurable"]
            out.append(dict(zip(CSV_COLUMNS, (
                c["op"], c["ranks"], c["size_bytes"], c["delay_s"], st["ring"]["algorithm"], st["ring"]["time_s"],
                st["torus"]["algorithm"], st["torus"]["time_s"], st["switch"]["algorithm"], st["switch"]["time_s"],
                rc["algorithm"], rc["time_s"], rc["reconfigurations"], c["speedup_vs_static_ring"],
                c["speedup_vs_best_static"]), strict=True)))
        return out

    def to_dict(self) -> dict:
        return {"grid": self.grid.to_dict(), **deepcopy({"excluded": list(self.excluded), "cells": list(self.cells),
                                                         "findings": list(self.findings)})}


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


def collective_study(grid: StudyGrid = StudyGrid(), *,
                     progress: Callable[[str], None] | None = None) -> CollectiveStudy:
    """Run the grid: cells, per-(op, n) tables and the derived findings."""
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
    return CollectiveStudy(grid=grid, excluded=tuple(excluded), cells=tuple(cells),
                           findings=tuple(_findings(grid, tables)), tables=tables)


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
