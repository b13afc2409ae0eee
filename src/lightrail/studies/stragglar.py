"""StragglAR against the algorithms that wait for a late rank, in the model: one case, or a sweep over
rank counts x delays x fabrics (the time to finish is affine in the delay, so each (fabric, n) is
generated, verified and timed once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lightrail.collectives import Kind, get, verify
from lightrail.errors import InfeasibleError, UnsupportedError
from lightrail.fabric.topology import Topology
from lightrail.timing import Engine

__all__ = ["StragglerTimes", "straggler_times", "straggler_comparison", "straggler_sweep"]

_STRAGGLER_BASELINES = ("ring", "halving-doubling", "double-binary-tree", "recursive-doubling")


@dataclass(frozen=True)
class StragglerTimes:
    """StragglAR's phase times and every waiting algorithm's own time for one (n, size, fabric).

    Time to finish is affine in the straggler's delay D: StragglAR takes ``max(D, phase 1) + phase 2``
    and an algorithm that waits takes ``D + its time``, so one of these serves every delay.

    Two speedups, both reported: ``speedup_over_ring`` counts from the early ranks' start,
    ``(D + ring) / (max(D, phase 1) + phase 2)``; ``speedup_over_ring_after_arrival`` counts from
    the straggler's arrival, as the StragglAR paper does, ``ring / (max(D, phase 1) + phase 2 - D)``
    (``phase 2`` alone once D covers phase 1). Likewise ``speedup_over_best`` and
    ``speedup_over_best_after_arrival`` against "wait, then the best algorithm".
    """

    ranks: int
    size_bytes: float
    topology: str
    phase1_s: float
    phase2_s: float
    waiting_s: dict[str, float]  # per algorithm that supports n, its time without the delay

    def at(self, delay: float) -> dict:
        """The comparison at straggler delay ``delay`` (what :func:`straggler_comparison` returns)."""
        rows = {"stragglar": max(delay, self.phase1_s) + self.phase2_s}
        for name, t in self.waiting_s.items():
            rows[name] = delay + t
        waiting = {k: v for k, v in rows.items() if k != "stragglar"}
        best = min(waiting, key=waiting.get)
        after = rows["stragglar"] - delay  # StragglAR's time from the straggler's arrival
        return {"ranks": self.ranks, "size_bytes": self.size_bytes, "delay_s": float(delay),
                "topology": self.topology, "stragglar_s": rows["stragglar"], "stragglar_phase1_s": self.phase1_s,
                "stragglar_phase2_s": self.phase2_s, "stragglar_after_arrival_s": after, "times_s": rows,
                "wait_then_best": best, "wait_then_best_s": waiting[best],
                "speedup_over_ring": rows.get("ring", float("nan")) / rows["stragglar"],
                "speedup_over_best": waiting[best] / rows["stragglar"],
                "speedup_over_ring_after_arrival": self.waiting_s.get("ring", float("nan")) / after,
                "speedup_over_best_after_arrival": self.waiting_s[best] / after}


def straggler_times(n: int, size: float, topology: Topology, *, alpha: float = 0.0,
                    algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES) -> StragglerTimes:
    """Generate, verify and time StragglAR (per phase) and the waiting algorithms once, for any delay."""
    from lightrail.collectives.stragglar import stragglar_allreduce

    engine = Engine(topology, alpha=alpha)
    schedule = stragglar_allreduce(n)
    verify(schedule)
    steps = engine.time(schedule, size).step_times
    split = schedule.params["phase1_steps"]
    phase1, phase2 = float(steps[:split].sum()), float(steps[split:].sum())
    waiting = {}
    for name in algorithms_to_compare:
        algo = get(Kind.ALLREDUCE, name)
        if algo.supports(n):
            waiting[name] = engine.time(algo(n), size).time_s
    if not waiting:
        raise UnsupportedError(f"none of {', '.join(algorithms_to_compare)} supports {n} ranks", field="ranks")
    return StragglerTimes(n, float(size), topology.name, phase1, phase2, waiting)


def straggler_comparison(n: int, size: float, delay: float, topology: Topology, *, alpha: float = 0.0,
                         algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES) -> dict:
    """Time to finish an AllReduce when rank n-1 arrives ``delay`` late.

    StragglAR runs its phase 1 among the early ranks during the delay (finishing at
    ``max(delay, phase 1)``) and its phase 2 after; every other algorithm must wait for the straggler
    (``delay + its time``). "wait then best" is the fastest of those. Speedups are given from the
    early ranks' start and from the straggler's arrival (:class:`StragglerTimes`).
    """
    return straggler_times(n, size, topology, alpha=alpha, algorithms_to_compare=algorithms_to_compare).at(delay)


def straggler_sweep(ranks: Sequence[int], delays: Sequence[float], size: float,
                    topologies: Mapping[str, Callable[[int], Topology]], *, alpha: float = 0.0,
                    algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES,
                    progress: Callable[[str], None] | None = None) -> dict:
    """StragglAR against Ring and "wait, then the best algorithm" over rank counts x delays x fabrics.

    ``topologies`` maps a name to a builder ``n -> Topology``. Each (topology, n) is generated,
    verified and timed once (:func:`straggler_times`); every delay is then arithmetic. A builder or
    algorithm that cannot handle n (an ``InfeasibleError`` or ``UnsupportedError``, e.g. rails with n
    not filling whole servers) skips that (topology, n), recorded with the reason under ``skipped``.
    ``progress(label)`` is called after each (topology, n).
    """
    ranks = sorted({int(n) for n in ranks})
    delays = sorted({float(d) for d in delays})
    cells, skipped, profiles = [], [], []
    for name, build in topologies.items():
        for n in ranks:
            try:
                times = straggler_times(n, size, build(n), alpha=alpha, algorithms_to_compare=algorithms_to_compare)
            except (InfeasibleError, UnsupportedError) as e:
                skipped.append({"topology": name, "ranks": n, "reason": str(e)})
            else:
                profiles.append({"topology": name, "ranks": n, "fabric": times.topology,
                                 "stragglar_phase1_s": times.phase1_s, "stragglar_phase2_s": times.phase2_s,
                                 "waiting_s": dict(times.waiting_s)})
                for d in delays:
                    c = times.at(d)
                    cells.append({"topology": name, "ranks": n, "delay_s": d, "stragglar_s": c["stragglar_s"],
                                  "ring_s": c["times_s"].get("ring", float("nan")),
                                  "best_waiting_s": c["wait_then_best_s"], "wait_then_best": c["wait_then_best"],
                                  "speedup_over_ring": c["speedup_over_ring"],
                                  "speedup_over_best": c["speedup_over_best"],
                                  "speedup_over_ring_after_arrival": c["speedup_over_ring_after_arrival"],
                                  "speedup_over_best_after_arrival": c["speedup_over_best_after_arrival"]})
            if progress:
                progress(f"{name} n={n}")
    return {"size_bytes": float(size), "alpha_s": float(alpha), "delays_s": delays, "ranks": ranks,
            "topologies": list(topologies), "algorithms": list(algorithms_to_compare), "cells": cells,
            "profiles": profiles, "skipped": skipped}
