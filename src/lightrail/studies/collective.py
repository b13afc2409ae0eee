"""Evaluate collective algorithms on a fabric: one case, or every algorithm over many sizes.

Each algorithm's schedule is generated, proven by the verifier and profiled once; timing it at a
size is then a handful of array maxima, so a sweep over 23 sizes costs about one simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from lightrail.collectives import Kind, algorithms, bus_factor, get, verify
from lightrail.errors import UnsupportedError
from lightrail.fabric.topology import Topology
from lightrail.timing import Engine

__all__ = ["CollectiveResult", "evaluate", "sweep", "generator_params"]


@dataclass(frozen=True)
class CollectiveResult:
    """One (algorithm, size) on one fabric; bandwidths follow nccl-tests' definitions."""

    op: str
    algorithm: str
    schedule: str
    ranks: int
    size_bytes: float
    topology: str
    time_s: float
    steps: int
    algbw_Bps: float
    busbw_Bps: float
    verified: bool
    verification: str

    def to_dict(self) -> dict:
        return asdict(self)


class _Prepared:
    """An algorithm's verified schedule and its per-step timing models on an engine."""

    def __init__(self, op: Kind, name: str, n: int, engine: Engine, params: dict):
        self.op, self.name = op, name
        self.schedule = get(op, name)(n, **params)
        self.proof = verify(self.schedule)
        self.engine = engine
        self.profile = engine.profile(self.schedule)

    def at(self, size: float) -> CollectiveResult:
        timing = self.engine.time(self.schedule, size, profile=self.profile)
        algbw = size / timing.time_s if timing.time_s > 0 else float("inf")
        n = self.schedule.nranks
        return CollectiveResult(str(self.op), self.name, self.schedule.name, n, float(size),
                                self.engine.topology.name, timing.time_s, timing.steps, algbw,
                                algbw * bus_factor(self.op, n), True, self.proof.method)


def generator_params(op: Kind, name: str, params: dict) -> dict:
    """Keep only the parameters this algorithm's generator takes (CLI options apply where they mean something)."""
    accepted = get(op, name).parameters
    return {k: v for k, v in params.items() if k in accepted}


def evaluate(op: str | Kind, algorithm: str, n: int, size: float, topology: Topology, *, alpha: float = 0.0,
             **params) -> CollectiveResult:
    """Generate, verify and time one collective algorithm on ``topology``."""
    op = get(op, algorithm).kind
    engine = Engine(topology, alpha=alpha)
    return _Prepared(op, algorithm, n, engine, generator_params(op, algorithm, params)).at(size)


def sweep(op: str | Kind, n: int, sizes: Sequence[float], topology: Topology, *, alpha: float = 0.0,
          names: Sequence[str] | None = None, progress: Callable[[str], None] | None = None,
          **params) -> list[CollectiveResult]:
    """Every algorithm of ``op`` (or those in ``names``) at every size; ``progress(name)`` per algorithm."""
    chosen = algorithms(op) if names is None else [get(op, name) for name in names]
    chosen = [a for a in chosen if a.supports(n)]
    if not chosen:
        raise UnsupportedError(f"no {op} algorithm supports {n} ranks", field="--ranks")
    engine = Engine(topology, alpha=alpha)
    rows = []
    for algo in chosen:
        prepared = _Prepared(algo.kind, algo.name, n, engine, generator_params(algo.kind, algo.name, params))
        rows.extend(prepared.at(size) for size in sizes)
        if progress:
            progress(algo.name)
    return rows
