"""The collaborative-ML study: one emulated population of edge clients and jobs under every scheduling policy.

Every policy sees the same clients, sessions, jobs and check-in random stream (``seed``); the population is the
documented synthetic default of :mod:`lightrail.fl.population` or trace files. Per policy it reports
``utilization`` (busy client-seconds computing for a job, lost work included / online client-seconds, over the
makespan), ``bindings_per_s`` (bindings per simulated second over the makespan), ``mean_jct_s`` (completion -
arrival, mean over jobs; a job not complete by the horizon counts at the horizon, and ``jobs_completed`` says
how many did), ``double_bookings`` (a client bound to two jobs at once, from the binding log; must be 0), and
the makespan, results, lost results (dropouts) and per-job JCTs. The model: :mod:`lightrail.fl.sim`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fl.policies import POLICIES, Policy
from lightrail.fl.population import DAY, Population, synthetic_population
from lightrail.fl.sim import simulate

__all__ = ["FlParams", "PolicyOutcome", "FlStudy", "fl_study", "CONTRACT"]

CONTRACT = ("utilization", "bindings_per_s", "mean_jct_s", "double_bookings")
"""The keys ``lightrail study fl --json`` promises per policy."""


@dataclass(frozen=True, kw_only=True)
class FlParams:
    """Settings of one study run (the CLI fills them from its flags)."""

    clients: int = 10_000
    jobs: int = 20
    seed: int = 0
    horizon_s: float = 7 * DAY
    """Sessions are generated over, and the simulation stops at, this time."""
    checkin_interval_s: float = 30.0
    """Mean gap between check-ins of an online, idle client (Poisson)."""
    job_gap_s: float = 600.0
    """Mean gap between job arrivals (Poisson) of the synthetic jobs."""

    def __post_init__(self):
        for name in ("clients", "jobs"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name}={getattr(self, name)}", field=name, fix="use 1 or more")
        if not (self.horizon_s > 0 and math.isfinite(self.horizon_s)):
            raise ScenarioError(f"horizon_s={self.horizon_s}", field="horizon_s", fix="a positive time")
        if not (self.checkin_interval_s >= 0 and math.isfinite(self.checkin_interval_s)):
            raise ScenarioError(f"checkin_interval_s={self.checkin_interval_s}", field="checkin_interval_s",
                                fix="a mean gap of 0 s or more")
        if not self.job_gap_s > 0:
            raise ScenarioError(f"job_gap_s={self.job_gap_s}", field="job_gap_s", fix="a positive time")


@dataclass(frozen=True)
class PolicyOutcome:
    """One policy's figures (the contract's keys are fields here)."""

    policy: str
    utilization: float
    bindings_per_s: float
    mean_jct_s: float
    double_bookings: int
    jobs_completed: int
    jobs: int
    makespan_s: float
    bindings: int
    results: int
    lost: int
    """Results lost because the client went offline before finishing (dropouts; the demand reopened)."""
    cut: int
    """Bindings still in flight at the horizon."""
    busy_client_s: float
    online_client_s: float
    median_jct_s: float
    jct_s: list[float]
    """Per job, in arrival order."""
    events: int
    elapsed_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class FlStudy:
    """Every policy on one population; ``to_dict()`` is what ``lightrail study fl --json`` prints."""

    clients: int
    jobs: int
    seed: int
    source: str
    horizon_s: float
    checkin_interval_s: float
    sessions: int
    outcomes: dict[str, PolicyOutcome]

    def rows(self) -> list[PolicyOutcome]:
        return list(self.outcomes.values())

    def ratio(self, policy: str, base: str) -> dict[str, float]:
        """``jct_speedup`` (base mean JCT / policy's) and ``utilization_ratio`` (policy's / base's)."""
        p, b = self.outcomes[policy], self.outcomes[base]
        return {"jct_speedup": b.mean_jct_s / p.mean_jct_s if p.mean_jct_s > 0 else math.nan,
                "utilization_ratio": p.utilization / b.utilization if b.utilization > 0 else math.nan}

    def headline(self) -> dict[str, dict[str, float]]:
        """IRS and SRSF against FIFO and static (those present)."""
        out = {}
        for p in ("irs", "srsf"):
            for b in ("fifo", "static"):
                if p in self.outcomes and b in self.outcomes:
                    out[f"{p}_vs_{b}"] = self.ratio(p, b)
        return out

    def to_dict(self) -> dict:
        policies = {}
        for name, o in self.outcomes.items():
            d = asdict(o)
            d.pop("policy")
            d["events_per_s"] = o.events_per_s
            policies[name] = d
        rows = [{"policy": name, **{k: v for k, v in d.items() if k != "jct_s"}} for name, d in policies.items()]
        return _finite({"clients": self.clients, "jobs": self.jobs, "seed": self.seed, "source": self.source,
                        "horizon_s": self.horizon_s, "checkin_interval_s": self.checkin_interval_s,
                        "sessions": self.sessions, "policies": policies, "rows": rows,
                        "headline": self.headline()})


def _finite(obj):
    """Strict JSON: NaN and infinities become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def run_policy(pop: Population, policy: Policy | str, params: FlParams) -> PolicyOutcome:
    run = simulate(pop, policy, seed=params.seed, checkin_interval_s=params.checkin_interval_s,
                   horizon_s=params.horizon_s)
    jct = run.jct_s
    return PolicyOutcome(
        policy=run.policy, utilization=run.utilization, bindings_per_s=run.bindings_per_s,
        mean_jct_s=float(jct.mean()) if jct.size else 0.0, double_bookings=run.double_bookings,
        jobs_completed=run.jobs_completed, jobs=len(jct), makespan_s=run.makespan_s, bindings=run.bindings,
        results=run.results, lost=run.lost, cut=run.cut, busy_client_s=run.busy_s, online_client_s=run.online_s,
        median_jct_s=float(np.median(jct)) if jct.size else 0.0, jct_s=[float(x) for x in jct],
        events=run.events, elapsed_s=run.elapsed_s)


def fl_study(params: FlParams, policies=POLICIES, *, population: Population | None = None,
             progress: Callable[[str], None] | None = None) -> FlStudy:
    """Run each policy on ``population`` (else the synthetic default from ``params``); ``progress(description)``
    is called once per finished policy."""
    names = [Policy.parse(p, field="policies") for p in policies]
    if not names:
        raise ScenarioError("no policy", field="policies", fix="one or more of " + ", ".join(POLICIES))
    if population is None:
        population = synthetic_population(params.clients, params.jobs, seed=params.seed, horizon_s=params.horizon_s,
                                          job_gap_s=params.job_gap_s)
    started = time.perf_counter()
    outcomes = {}
    for p in names:
        outcomes[p.value] = run_policy(population, p, params)
        if progress:
            progress(f"fl: {p.value} done ({time.perf_counter() - started:.1f} s)")
    return FlStudy(clients=len(population.clients), jobs=len(population.jobs), seed=params.seed,
                   source=population.source, horizon_s=params.horizon_s,
                   checkin_interval_s=params.checkin_interval_s, sessions=len(population.session_start),
                   outcomes=outcomes)
