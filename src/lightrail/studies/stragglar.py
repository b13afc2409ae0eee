"""StragglAR against the algorithms that wait for a late rank, in the model: phase-2 rounds against the
bound, one case, or a sweep over rank counts x delays x fabrics (the time to finish is affine in the
delay, so each (fabric, n) is generated, verified and timed once). Results are typed; ``to_dict()``
is the JSON that ``lightrail stragglar ... --json`` prints. Measured for real on gloo processes:
:mod:`lightrail.studies.stragglar_run`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from lightrail.collectives import Kind, get, verify
from lightrail.errors import InfeasibleError, ScenarioError, UnsupportedError
from lightrail.fabric.builders import GPUS_PER_SERVER, HOSTS_PER_LEAF, NVLINK_BANDWIDTH, TOPOLOGIES, build_topology
from lightrail.fabric.topology import Topology
from lightrail.timing import Engine
from lightrail.units import format_time

__all__ = ["RoundsRow", "StragglarRounds", "stragglar_rounds", "StragglarTimes", "AlgorithmTime",
           "StragglarComparison", "stragglar_times", "stragglar_comparison", "SweepCell", "SweepProfile",
           "SkippedCase", "SweepSettings", "StragglarSweep", "stragglar_sweep", "fabric_sweep", "default_at_delay",
           "default_at_ranks"]

_STRAGGLER_BASELINES = ("ring", "halving-doubling", "double-binary-tree", "recursive-doubling")


@dataclass(frozen=True)
class RoundsRow:
    ranks: int
    rounds: int
    lower_bound: int

    @property
    def gap(self) -> int:
        return self.rounds - self.lower_bound


@dataclass(frozen=True)
class StragglarRounds:
    """Phase-2 rounds of the synthesised schedule against the lower bound, per rank count."""

    entries: tuple[RoundsRow, ...]

    def rows(self) -> list[RoundsRow]:
        return list(self.entries)

    def to_dict(self) -> dict:
        """One rank count: its row; several: ``{"rows": [...]}``."""
        rows = [asdict(r) for r in self.entries]
        return rows[0] if len(rows) == 1 else {"rows": rows}


def stragglar_rounds(ranks: Sequence[int], *, progress: Callable[[int], None] | None = None) -> StragglarRounds:
    """Synthesise phase 2 for each rank count (in the given order); ``progress(n)`` after each."""
    from lightrail.collectives.stragglar import lower_bound, phase2

    rows = []
    for n in ranks:
        # uncached: a long range would otherwise keep hundreds of large schedules in memory
        rows.append(RoundsRow(int(n), int(phase2.__wrapped__(n).rounds), int(lower_bound(n))))
        if progress:
            progress(n)
    return StragglarRounds(tuple(rows))


@dataclass(frozen=True)
class AlgorithmTime:
    """One algorithm's time to finish, from the early ranks' start and from the straggler's arrival."""

    algorithm: str
    time_s: float
    after_arrival_s: float


@dataclass(frozen=True)
class StragglarComparison:
    """Every algorithm's time to finish with the straggler ``delay_s`` late (see :class:`StragglarTimes`)."""

    ranks: int
    size_bytes: float
    delay_s: float
    topology: str
    stragglar_s: float
    stragglar_phase1_s: float
    stragglar_phase2_s: float
    stragglar_after_arrival_s: float
    times_s: dict[str, float]  # StragglAR's and every waiting algorithm's, delay included
    wait_then_best: str
    wait_then_best_s: float
    speedup_over_ring: float
    speedup_over_best: float
    speedup_over_ring_after_arrival: float
    speedup_over_best_after_arrival: float

    def rows(self) -> list[AlgorithmTime]:
        """Fastest first."""
        ranked = sorted(self.times_s.items(), key=lambda kv: kv[1])
        return [AlgorithmTime(name, t, t - self.delay_s) for name, t in ranked]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StragglarTimes:
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

    def at(self, delay: float) -> StragglarComparison:
        """The comparison at straggler delay ``delay`` (what :func:`stragglar_comparison` returns)."""
        rows = {"stragglar": max(delay, self.phase1_s) + self.phase2_s}
        for name, t in self.waiting_s.items():
            rows[name] = delay + t
        waiting = {k: v for k, v in rows.items() if k != "stragglar"}
        best = min(waiting, key=waiting.get)
        after = rows["stragglar"] - delay  # StragglAR's time from the straggler's arrival
        return StragglarComparison(
            ranks=self.ranks, size_bytes=self.size_bytes, delay_s=float(delay), topology=self.topology,
            stragglar_s=rows["stragglar"], stragglar_phase1_s=self.phase1_s, stragglar_phase2_s=self.phase2_s,
            stragglar_after_arrival_s=after, times_s=rows, wait_then_best=best, wait_then_best_s=waiting[best],
            speedup_over_ring=rows.get("ring", float("nan")) / rows["stragglar"],
            speedup_over_best=waiting[best] / rows["stragglar"],
            speedup_over_ring_after_arrival=self.waiting_s.get("ring", float("nan")) / after,
            speedup_over_best_after_arrival=self.waiting_s[best] / after)


def stragglar_times(n: int, size: float, topology: Topology, *, alpha: float = 0.0,
                    algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES) -> StragglarTimes:
    """Generate, verify and time StragglAR (per phase) and the waiting algorithms once, for any delay."""
    from lightrail.collectives.stragglar import stragglar_allreduce

    engine = Engine(topology, alpha=alpha)
    schedule = stragglar_allreduce(n)
    verify(schedule)
    steps = engine.time(schedule, size).step_times
    split = schedule.params["phase1_steps"]
    with np.errstate(over="ignore"):  # a link slow enough never finishes: inf (JSON null), as Engine.time says
        phase1, phase2 = float(steps[:split].sum()), float(steps[split:].sum())
    waiting = {}
    for name in algorithms_to_compare:
        algo = get(Kind.ALLREDUCE, name)
        if algo.supports(n):
            waiting[name] = engine.time(algo(n), size).time_s
    if not waiting:
        raise UnsupportedError(f"none of {', '.join(algorithms_to_compare)} supports {n} ranks", field="ranks")
    return StragglarTimes(n, float(size), topology.name, phase1, phase2, waiting)


def stragglar_comparison(n: int, size: float, delay: float, topology: Topology, *, alpha: float = 0.0,
                         algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES) -> StragglarComparison:
    """Time to finish an AllReduce when rank n-1 arrives ``delay`` late.

    StragglAR runs its phase 1 among the early ranks during the delay (finishing at
    ``max(delay, phase 1)``) and its phase 2 after; every other algorithm must wait for the straggler
    (``delay + its time``). "wait then best" is the fastest of those. Speedups are given from the
    early ranks' start and from the straggler's arrival (:class:`StragglarTimes`).
    """
    return stragglar_times(n, size, topology, alpha=alpha, algorithms_to_compare=algorithms_to_compare).at(delay)


@dataclass(frozen=True)
class SweepCell:
    """One (fabric, n, delay) of a sweep: StragglAR against Ring and against "wait, then the best"."""

    topology: str
    ranks: int
    delay_s: float
    stragglar_s: float
    ring_s: float  # nan where Ring does not support n
    best_waiting_s: float
    wait_then_best: str
    speedup_over_ring: float
    speedup_over_best: float
    speedup_over_ring_after_arrival: float
    speedup_over_best_after_arrival: float


@dataclass(frozen=True)
class SweepProfile:
    """The phase times of one (fabric, n): with them, every delay's curve is exact (the plots use it)."""

    topology: str
    ranks: int
    fabric: str  # the built topology's own name, e.g. ``switch(n=8)``
    stragglar_phase1_s: float
    stragglar_phase2_s: float
    waiting_s: dict[str, float]


@dataclass(frozen=True)
class SkippedCase:
    """A (fabric, n) the fabric or every waiting algorithm cannot handle, with the reason."""

    topology: str
    ranks: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    """The fabric knobs of a sweep over named fabrics, and the slices its table and plots show."""

    bandwidth_Bps: float
    latency_s: float
    gpus_per_server: int
    nvlink_bandwidth_Bps: float
    hosts_per_leaf: int
    at_delay_s: float  # the speedup-vs-ranks plot's and the table's delay
    at_ranks: int  # the speedup-vs-delay plot's rank count


def default_at_delay(delays: Sequence[float]) -> float:
    """250 us if swept (about a 64 MiB AllReduce's phase 1 on NVLink), else the largest delay."""
    return next((d for d in delays if math.isclose(d, 250e-6)), max(delays))


def default_at_ranks(ranks: Sequence[int]) -> int:
    return 8 if 8 in ranks else min(ranks)


@dataclass(frozen=True)
class StragglarSweep:
    """StragglAR against Ring and "wait, then the best algorithm" over rank counts x delays x fabrics."""

    size_bytes: float
    alpha_s: float
    delays_s: tuple[float, ...]
    ranks: tuple[int, ...]
    topologies: tuple[str, ...]
    algorithms: tuple[str, ...]
    cells: tuple[SweepCell, ...]
    profiles: tuple[SweepProfile, ...]
    skipped: tuple[SkippedCase, ...]
    settings: SweepSettings | None = None  # set by :func:`fabric_sweep`

    @property
    def at_delay_s(self) -> float:
        return self.settings.at_delay_s if self.settings else default_at_delay(self.delays_s)

    @property
    def at_ranks(self) -> int:
        return self.settings.at_ranks if self.settings else default_at_ranks(self.ranks)

    def rows(self) -> list[SweepCell]:
        """The table: every (fabric, n) at :attr:`at_delay_s`, fabric by fabric."""
        return [c for c in self.cells if c.delay_s == self.at_delay_s]

    def to_dict(self) -> dict:
        out = {"size_bytes": self.size_bytes, "alpha_s": self.alpha_s, "delays_s": list(self.delays_s),
               "ranks": list(self.ranks), "topologies": list(self.topologies), "algorithms": list(self.algorithms),
               "cells": [asdict(c) for c in self.cells], "profiles": [asdict(p) for p in self.profiles],
               "skipped": [asdict(s) for s in self.skipped]}
        if self.settings is not None:
            out["settings"] = asdict(self.settings)
        return out


def stragglar_sweep(ranks: Sequence[int], delays: Sequence[float], size: float,
                    topologies: Mapping[str, Callable[[int], Topology]], *, alpha: float = 0.0,
                    algorithms_to_compare: Sequence[str] = _STRAGGLER_BASELINES,
                    progress: Callable[[str], None] | None = None) -> StragglarSweep:
    """StragglAR against Ring and "wait, then the best algorithm" over rank counts x delays x fabrics.

    ``topologies`` maps a name to a builder ``n -> Topology``. Each (topology, n) is generated,
    verified and timed once (:func:`stragglar_times`); every delay is then arithmetic. A builder or
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
                times = stragglar_times(n, size, build(n), alpha=alpha, algorithms_to_compare=algorithms_to_compare)
            except (InfeasibleError, UnsupportedError) as e:
                skipped.append(SkippedCase(name, n, str(e)))
            else:
                profiles.append(SweepProfile(name, n, times.topology, times.phase1_s, times.phase2_s,
                                             dict(times.waiting_s)))
                for d in delays:
                    c = times.at(d)
                    cells.append(SweepCell(name, n, d, c.stragglar_s, c.times_s.get("ring", float("nan")),
                                           c.wait_then_best_s, c.wait_then_best, c.speedup_over_ring,
                                           c.speedup_over_best, c.speedup_over_ring_after_arrival,
                                           c.speedup_over_best_after_arrival))
            if progress:
                progress(f"{name} n={n}")
    return StragglarSweep(float(size), float(alpha), tuple(delays), tuple(ranks), tuple(topologies),
                          tuple(algorithms_to_compare), tuple(cells), tuple(profiles), tuple(skipped))


def fabric_sweep(ranks: Sequence[int], delays: Sequence[float], size: float, topologies: Sequence[str], *,
                 bandwidth: float, latency: float, alpha: float = 0.0, gpus_per_server: int = GPUS_PER_SERVER,
                 hosts_per_leaf: int = HOSTS_PER_LEAF, nvlink_bandwidth: float = NVLINK_BANDWIDTH,
                 at_delay: float | None = None, at_ranks: int | None = None,
                 progress: Callable[[str], None] | None = None) -> StragglarSweep:
    """:func:`stragglar_sweep` on fabrics named in :data:`~lightrail.fabric.builders.TOPOLOGIES`, built
    with these knobs; ``at_delay`` (one of ``delays``) and ``at_ranks`` (one of ``ranks``) pick the
    slices of the table and plots (defaults: :func:`default_at_delay`, :func:`default_at_ranks`).

    Everything is checked before anything is computed; errors name the ``stragglar sweep`` flags."""
    ranks = sorted({int(n) for n in ranks})
    delays = sorted({float(d) for d in delays})
    names = list(dict.fromkeys(topologies))
    if not ranks or min(ranks) < 2:
        raise ScenarioError(f"{ranks} lists no rank count of 2 or more", field="--ranks", fix="e.g. 4,8,16")
    if not delays or min(delays) < 0 or not all(map(math.isfinite, delays)):
        raise ScenarioError(f"{delays} is not a list of non-negative delays", field="--straggler-delays",
                            fix="e.g. 0,50us,1ms")
    unknown = [t for t in names if t not in TOPOLOGIES]
    if unknown or not names:
        raise ScenarioError(f"unknown topology {', '.join(map(repr, unknown))}" if unknown else "no topology given",
                            field="--topologies", fix="use a comma list of " + ", ".join(TOPOLOGIES))
    if gpus_per_server < 1 or hosts_per_leaf < 1:
        raise ScenarioError("must be at least 1", field="--gpus-per-server" if gpus_per_server < 1
                            else "--hosts-per-leaf")
    if at_delay is None:
        chosen_delay = default_at_delay(delays)
    else:
        chosen_delay = next((d for d in delays if math.isclose(d, at_delay, rel_tol=1e-9, abs_tol=1e-15)), None)
        if chosen_delay is None:
            raise ScenarioError(f"{format_time(at_delay) if at_delay else '0'} is not one of --straggler-delays",
                                field="--at-straggler-delay",
                                fix="use one of " + ", ".join(format_time(d) if d else "0" for d in delays))
    if at_ranks is not None and at_ranks not in ranks:
        raise ScenarioError(f"{at_ranks} is not one of --ranks", field="--at-ranks",
                            fix="use one of " + ", ".join(map(str, ranks)))
    chosen_ranks = default_at_ranks(ranks) if at_ranks is None else at_ranks

    def builder(name: str) -> Callable[[int], Topology]:
        return lambda n: build_topology(name, n, bandwidth=bandwidth, latency=latency, gpus_per_server=gpus_per_server,
                                        nvlink_bandwidth=nvlink_bandwidth, hosts_per_leaf=hosts_per_leaf)

    result = stragglar_sweep(ranks, delays, size, {t: builder(t) for t in names}, alpha=alpha, progress=progress)
    if not result.cells:
        raise ScenarioError("no fabric supports any of these rank counts", field="--ranks",
                            fix="; ".join(f"{s.topology} n={s.ranks}: {s.reason}" for s in result.skipped))
    if not any(c.ranks == chosen_ranks for c in result.cells):
        raise ScenarioError(f"no fabric supports {chosen_ranks} ranks", field="--at-ranks",
                            fix="use one of " + ", ".join(map(str, sorted({c.ranks for c in result.cells}))))
    settings = SweepSettings(bandwidth_Bps=bandwidth, latency_s=latency, gpus_per_server=gpus_per_server,
                             nvlink_bandwidth_Bps=nvlink_bandwidth, hosts_per_leaf=hosts_per_leaf,
                             at_delay_s=chosen_delay, at_ranks=chosen_ranks)
    return replace(result, settings=settings)


# The names before issue 32 gave StragglAR's study one spelling, kept for code that imports them.
StragglerTimes = StragglarTimes
StragglerComparison = StragglarComparison
StragglerSweep = StragglarSweep
straggler_times = stragglar_times
straggler_comparison = stragglar_comparison
straggler_sweep = stragglar_sweep
