"""The collaborative-ML study: one emulated population of edge clients and jobs under every scheduling policy.

Every policy sees the same clients, sessions, jobs and check-in random stream (``seed``); the population is the
documented synthetic default of :mod:`lightrail.fl.population` or trace files; rounds run as Propius runs them
(:mod:`lightrail.fl.rounds`: over-selection, completion at ``demand`` results, late results, round timeout). Per
policy it reports, as Propius measures them (see :mod:`lightrail.fl.sim`): ``utilization`` (client-seconds of work
whose result a round used / online client-seconds, over the run; ``busy_utilization`` counts all bound work),
``bindings_per_s`` (bindings per simulated second of the run), ``mean_jct_s`` (completion - arrival, mean over the
jobs that finished; ``jobs_completed`` and ``jobs_unfinished`` say how many did), ``late_results`` (results that
arrived after their round had ended, discarded), ``double_bookings`` (a client bound to two jobs at once, from the
binding log; must be 0), and the makespan, results, dropouts, failed rounds and per-job JCTs (null: unfinished).
The run stops when every job is done, and at the latest at the horizon (default 30 days).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fl.policies import POLICIES, Policy
from lightrail.fl.population import Population, synthetic_population
from lightrail.fl.rounds import DEFAULT_OVER_SELECTION, RoundRules
from lightrail.fl.sim import HORIZON_CAP_S, simulate

__all__ = ["FlParams", "PolicyOutcome", "FlStudy", "fl_study", "CONTRACT"]

CONTRACT = ("utilization", "bindings_per_s", "mean_jct_s", "jobs_completed", "double_bookings", "late_results")
"""The keys ``lightrail study fl --json`` promises per policy."""


@dataclass(frozen=True, kw_only=True)
class FlParams:
    """Settings of one study run (the CLI fills them from its flags)."""

    clients: int = 10_000
    jobs: int = 20
    seed: int = 0
    horizon_s: float | None = None
    """The run stops when every job is done, or at this time; None: at ``HORIZON_CAP_S`` (30 days). Synthetic
    sessions are generated over it."""
    over_selection: float = DEFAULT_OVER_SELECTION
    """Clients bound per round, as a multiple of demand (Propius and FedScale: 1.3)."""
    round_timeout_s: float | None = None
    """A round not complete this long after it opened fails and runs again; None: no timeout."""
    checkin_interval_s: float = 30.0
    """Mean gap between check-ins of an online, idle client (Poisson)."""
    job_gap_s: float = 600.0
    """Mean gap between job arrivals (Poisson) of the synthetic jobs."""

    def __post_init__(self):
        for name in ("clients", "jobs"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name}={getattr(self, name)}", field=name, fix="use 1 or more")
        if self.horizon_s is not None and not (self.horizon_s > 0 and math.isfinite(self.horizon_s)):
            raise ScenarioError(f"horizon_s={self.horizon_s}", field="horizon_s", fix="a positive time, e.g. 30d")
        self.rules  # noqa: B018 - checks over_selection and round_timeout_s
        if not (self.checkin_interval_s >= 0 and math.isfinite(self.checkin_interval_s)):
            raise ScenarioError(f"checkin_interval_s={self.checkin_interval_s}", field="checkin_interval_s",
                                fix="a mean gap of 0 s or more")
        if not self.job_gap_s > 0:
            raise ScenarioError(f"job_gap_s={self.job_gap_s}", field="job_gap_s", fix="a positive time")

    @property
    def rules(self) -> RoundRules:
        return RoundRules(over_selection=self.over_selection, round_timeout_s=self.round_timeout_s)

    @property
    def horizon(self) -> float:
        """The horizon in seconds (the cap when none was given)."""
        return HORIZON_CAP_S if self.horizon_s is None else float(self.horizon_s)


@dataclass(frozen=True)
class PolicyOutcome:
    """One policy's figures (the contract's keys are fields here)."""

    policy: str
    utilization: float
    """Client-seconds of work whose result was used / online client-seconds."""
    bindings_per_s: float
    mean_jct_s: float
    """Mean JCT of the jobs that finished (nan, null in JSON, if none did)."""
    double_bookings: int
    jobs_completed: int
    jobs: int
    makespan_s: float
    """When the run stopped: the last job's completion, or the horizon."""
    bindings: int
    results: int
    """Results their rounds used."""
    lost: int
    """Results lost because the client went offline before finishing (dropouts; the place reopened)."""
    cut: int
    """Bindings still in flight when the run stopped (and results held by a round still open then)."""
    busy_client_s: float
    online_client_s: float
    median_jct_s: float
    jct_s: list[float]
    """Per job, in arrival order (nan, null in JSON: did not finish)."""
    events: int
    elapsed_s: float
    late_results: int = 0
    """Results that arrived after their round had ended: discarded."""
    discarded_results: int = 0
    """Results of rounds that timed out (failed rounds run again)."""
    failed_rounds: int = 0
    jobs_unfinished: int = 0
    busy_utilization: float = 0.0
    """All bound client-seconds (late, lost, discarded work too) / online client-seconds: what Propius's
    evaluation clients report."""

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
    over_selection: float = DEFAULT_OVER_SELECTION
    round_timeout_s: float | None = None

    def rows(self) -> list[PolicyOutcome]:
        return list(self.outcomes.values())

    def ratio(self, policy: str, base: str) -> dict[str, float]:
        """``jct_speedup`` (base mean JCT / policy's) and ``utilization_ratio`` (policy's / base's)."""
        p, b = self.outcomes[policy], self.outcomes[base]
        return {"jct_speedup": b.mean_jct_s / p.mean_jct_s if p.mean_jct_s > 0 else math.nan,  # nan if none done
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
                        "over_selection": self.over_selection, "round_timeout_s": self.round_timeout_s,
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
                   horizon_s=params.horizon, rules=params.rules)
    jct = run.jct_s
    done = jct[run.finished]
    return PolicyOutcome(
        policy=run.policy, utilization=run.utilization, bindings_per_s=run.bindings_per_s,
        mean_jct_s=run.mean_jct_s, double_bookings=run.double_bookings,
        jobs_completed=run.jobs_completed, jobs=len(jct), makespan_s=run.makespan_s, bindings=run.bindings,
        results=run.results, lost=run.lost, cut=run.cut, busy_client_s=run.busy_s, online_client_s=run.online_s,
        median_jct_s=float(np.median(done)) if done.size else math.nan, jct_s=[float(x) for x in jct],
        events=run.events, elapsed_s=run.elapsed_s, late_results=run.late, discarded_results=run.discarded,
        failed_rounds=run.failed_rounds, jobs_unfinished=run.jobs_unfinished,
        busy_utilization=run.busy_utilization)


def fl_study(params: FlParams, policies=POLICIES, *, population: Population | None = None,
             progress: Callable[[str], None] | None = None) -> FlStudy:
    """Run each policy on ``population`` (else the synthetic default from ``params``); ``progress(description)``
    is called once per finished policy."""
    names = [Policy.parse(p, field="policies") for p in policies]
    if not names:
        raise ScenarioError("no policy", field="policies", fix="one or more of " + ", ".join(POLICIES))
    if population is None:
        population = synthetic_population(params.clients, params.jobs, seed=params.seed, horizon_s=params.horizon,
                                          job_gap_s=params.job_gap_s)
    started = time.perf_counter()
    outcomes = {}
    for p in names:
        outcomes[p.value] = run_policy(population, p, params)
        if progress:
            progress(f"fl: {p.value} done ({time.perf_counter() - started:.1f} s)")
    return FlStudy(clients=len(population.clients), jobs=len(population.jobs), seed=params.seed,
                   source=population.source, horizon_s=params.horizon,
                   checkin_interval_s=params.checkin_interval_s, sessions=len(population.session_start),
                   outcomes=outcomes, over_selection=params.over_selection, round_timeout_s=params.round_timeout_s)
