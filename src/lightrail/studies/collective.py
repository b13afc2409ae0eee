"""Evaluate collective algorithms on a fabric: one case, or every algorithm over many sizes.

Each algorithm's schedule is generated, proven by the verifier and profiled once; timing it at a
size is then a handful of array maxima, so a sweep over 23 sizes costs about one simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from lightrail.collectives import Kind, algorithms, bus_factor, get, verify
from lightrail.collectives.compressed import compressed_form, verify_compressed
from lightrail.errors import UnsupportedError
from lightrail.fabric.topology import Topology
from lightrail.timing import Engine

if TYPE_CHECKING:  # the PCCL planner and its fabric are imported by the reconfigurable case alone (start-up)
    from lightrail.fabric.params import ReconfigurableFabric

__all__ = ["CollectiveResult", "CollectiveSweep", "ReconfigurableResult", "evaluate", "sweep", "collective_sweep",
           "reconfigurable_collective", "generator_params"]


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


class _PreparedCompressed(_Prepared):
    """The same, from the algorithm's compressed form (``collectives.compressed``): never materialises the
    transfers, so a 65,536-rank ring takes megabytes; results equal the explicit path's."""

    def __init__(self, op: Kind, name: str, compressed, engine: Engine):
        self.op, self.name = op, name
        self.schedule = compressed
        self.proof = verify_compressed(compressed)
        self.engine = engine
        self.profile = engine.profile_compressed(compressed)  # ``at`` then times it as the explicit path does


def _prepare(op: Kind, name: str, n: int, engine: Engine, params: dict) -> _Prepared:
    """The compressed path where the algorithm has one for ``n`` (and these parameters), else the explicit one."""
    algorithm = get(op, name)
    compressed = compressed_form(op, name, n, **params) if n >= 2 and algorithm.supports(n) else None
    if compressed is not None:
        return _PreparedCompressed(op, name, compressed, engine)
    return _Prepared(op, name, n, engine, params)


def generator_params(op: Kind, name: str, params: dict) -> dict:
    """Keep only the parameters this algorithm's generator takes (CLI options apply where they mean something)."""
    accepted = get(op, name).parameters
    return {k: v for k, v in params.items() if k in accepted}


def evaluate(op: str | Kind, algorithm: str, n: int, size: float, topology: Topology, *, alpha: float = 0.0,
             **params) -> CollectiveResult:
    """Generate, verify and time one collective algorithm on ``topology``."""
    op = get(op, algorithm).kind
    engine = Engine(topology, alpha=alpha)
    return _prepare(op, algorithm, n, engine, generator_params(op, algorithm, params)).at(size)


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
        prepared = _prepare(algo.kind, algo.name, n, engine, generator_params(algo.kind, algo.name, params))
        rows.extend(prepared.at(size) for size in sizes)
        if progress:
            progress(algo.name)
    return rows


@dataclass(frozen=True, kw_only=True)
class CollectiveSweep:
    """Every algorithm of one op at every size on one fabric, and the fastest per size.

    ``bandwidth_Bps`` and ``latency_s`` echo the settings the fabric was built from (a fabric with
    NVLink and NIC links has no single rate to read back)."""

    op: str
    ranks: int
    topology: str
    sizes: tuple[float, ...]
    bandwidth_Bps: float
    latency_s: float
    alpha_s: float
    results: tuple[CollectiveResult, ...]

    @property
    def algorithms(self) -> list[str]:
        """Algorithm names in the order they were run."""
        return list(dict.fromkeys(r.algorithm for r in self.results))

    def times(self, size: float) -> dict[str, float]:
        """Seconds per algorithm at one size."""
        return {r.algorithm: r.time_s for r in self.results if r.size_bytes == size}

    def best(self) -> dict[float, CollectiveResult]:
        """The fastest algorithm per size, smallest size first; ties go to the algorithm run first."""
        best: dict[float, CollectiveResult] = {}
        for r in self.results:
            if r.size_bytes not in best or r.time_s < best[r.size_bytes].time_s:
                best[r.size_bytes] = r
        return dict(sorted(best.items()))

    def rows(self) -> list[dict]:
        return [r.to_dict() for r in self.results]

    def to_dict(self) -> dict:
        return {"op": self.op, "ranks": self.ranks, "topology": self.topology,
                "settings": {"bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s,
                             "alpha_s": self.alpha_s},
                "best": [{"size_bytes": s, "algorithm": r.algorithm, "time_s": r.time_s}
                         for s, r in self.best().items()],
                "rows": self.rows()}


def collective_sweep(op: str | Kind, n: int, sizes: Sequence[float], topology: Topology, *, bandwidth: float,
                     latency: float, alpha: float = 0.0, names: Sequence[str] | None = None,
                     progress: Callable[[str], None] | None = None, **params) -> CollectiveSweep:
    """:func:`sweep`, with the settings and the best algorithm per size (``bandwidth``/``latency`` are recorded)."""
    results = sweep(op, n, sizes, topology, alpha=alpha, names=names, progress=progress, **params)
    return CollectiveSweep(op=str(results[0].op), ranks=n, topology=topology.name, sizes=tuple(sizes),
                           bandwidth_Bps=bandwidth, latency_s=latency, alpha_s=alpha, results=tuple(results))


@dataclass(frozen=True, kw_only=True)
class ReconfigurableResult:
    """One collective planned exactly on a reconfigurable fabric, against its initial circuits and the
    threshold heuristic; ``plan`` is one entry per step (stay or reconfigure, configuration, time)."""

    op: str
    algorithm: str
    schedule: str
    ranks: int
    size_bytes: float
    topology: str
    ports: int
    time_s: float
    static_time_s: float
    threshold_time_s: float
    steps: int
    algbw_Bps: float
    busbw_Bps: float
    verified: bool
    verification: str
    reconfig_delay_s: float
    reconfigurations: int
    exact: bool
    plan: tuple[dict, ...]

    def rows(self) -> list[dict]:
        return [dict(step) for step in self.plan]

    def to_dict(self) -> dict:
        keys = ("op", "algorithm", "schedule", "ranks", "size_bytes", "topology", "time_s", "static_time_s",
                "threshold_time_s", "steps", "algbw_Bps", "busbw_Bps", "verified", "verification",
                "reconfig_delay_s", "reconfigurations", "exact")
        return {**{k: getattr(self, k) for k in keys}, "plan": self.rows()}


def reconfigurable_collective(op: str | Kind, algorithm: str, size: float, fabric: ReconfigurableFabric,
                              **params) -> ReconfigurableResult:
    """Generate and verify ``algorithm`` on ``fabric.n`` ranks, and plan it exactly on ``fabric`` (PCCL-style)."""
    algo = get(op, algorithm)
    schedule = algo(fabric.n, **generator_params(algo.kind, algo.name, params))
    from lightrail.control.pccl import Planner

    proof = verify(schedule)
    planner = Planner(schedule, fabric)
    plan, static, greedy = planner.plan(size), planner.plan_static(size), planner.plan_threshold(size)
    algbw = size / plan.total_s
    return ReconfigurableResult(
        op=str(algo.kind), algorithm=algo.name, schedule=schedule.name, ranks=fabric.n, size_bytes=size,
        topology=f"reconfigurable(ports={fabric.ports},base={fabric.base})", ports=fabric.ports,
        time_s=plan.total_s, static_time_s=static.total_s, threshold_time_s=greedy.total_s, steps=schedule.nsteps,
        algbw_Bps=algbw, busbw_Bps=algbw * bus_factor(algo.kind, fabric.n), verified=True,
        verification=proof.method, reconfig_delay_s=fabric.ocs_delay, reconfigurations=plan.reconfigurations,
        exact=planner.exact, plan=tuple(plan.to_dict()["plan"]))
