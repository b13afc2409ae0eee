"""What photonic rails do to a training job: electrical vs photonic vs ideal, the policy ablation,
power and cost, and the reconfiguration-delay sweep. Pure functions over a built scenario."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING

from lightrail.control.opus import KNOBS, ORIGINAL, OpusPlanner
from lightrail.control.plan import Mode, Plan, Policy
from lightrail.fabric.params import FabricKind, RailFabric
from lightrail.sim.iteration import IterationResult, OpDurations, simulate_iteration
from lightrail.sim.trace import chrome_trace
from lightrail.studies.cost import compare
from lightrail.workload.program import build_program

if TYPE_CHECKING:
    from lightrail.scenario import Built

__all__ = ["ABLATION", "BREAKDOWN", "JobRuns", "PolicyRun", "DelayRun", "RailsComparison", "DelaySweep",
           "compare_rails", "delay_sweep", "overhead_breakdown"]

_KNOB_LABELS = {"skip_present": "+ skip if present", "partial": "+ partial reconfiguration",
                "split_pp": "+ split pipeline rails", "defer_dp": "+ deferred DP buckets", "leases": "+ leases"}
ABLATION: tuple[tuple[str, dict], ...] = (("opus (original)", {}),) + tuple(
    (_KNOB_LABELS[k], {j: True for j in KNOBS[: i + 1]}) for i, k in enumerate(KNOBS))
"""Policies from the published Opus to all of lightrail's improvements, each adding one."""

BREAKDOWN = (("switching_delay_s", "switching"), ("drain_wait_s", "drain wait"), ("control_plane_s", "control"),
             ("lost_overlap_s", "lost overlap"))
"""Parts of the photonic overhead (``overhead_breakdown``) and their labels, summing to photonic minus
electrical time."""


class JobRuns:
    """Simulations of one job that share what does not depend on the delay or the controller's latency:
    the programs, the planners (circuits, plans) and the op durations."""

    def __init__(self, job):
        self.job = job
        self._programs: dict = {}
        self._planners: dict = {}
        self._durations: dict = {}
        self._runs: dict = {}

    def run(self, fabric: RailFabric, policy: Policy) -> IterationResult:
        """:meth:`__call__`, simulated once per (fabric, policy): the ablation's last row is the scenario's own
        policy in its mode (with the same three counterfactuals), and each simulation is deterministic.

        Runs that would decide alike are taken, not simulated again: a policy with ``skip_present`` whose twin
        without it ran here and never rewrote a rail holding the op's circuits
        (:attr:`IterationResult.same_with_skip_present`); a run without draining whose twin with it never waited to
        drain (:attr:`IterationResult.same_without_drain`: the breakdown's last counterfactual under deferred
        buckets); the ideal rail, which is the photonic rail with no delay, controller latency or grant lag (every
        timing the simulator reads is zero on both; the breakdown's zero-delay run), named ideal."""
        if isinstance(policy, Plan):
            return self(fabric, policy)
        if fabric.kind is FabricKind.IDEAL:
            zero = replace(fabric, kind=FabricKind.PHOTONIC, ocs_delay=0.0, check_in_rtt=0.0, command_latency=0.0,
                           revoke_rtt=0.0, switch_grant_latency=0.0)
            key = (fabric, policy)
            if key not in self._runs:
                self._runs[key] = replace(self.run(zero, policy), fabric=fabric.kind.value)
            return self._runs[key]
        key = (fabric, policy)
        if key not in self._runs:
            twin = self._runs.get((fabric, replace(policy, skip_present=False))) if policy.skip_present else None
            drained = self._runs.get((replace(fabric, drain=True), policy)) if not fabric.drain else None
            if twin is not None and twin.same_with_skip_present:  # it never rewrote a rail this policy keeps
                self._runs[key] = twin.with_policy(policy)
            elif drained is not None and drained.same_without_drain:  # no switch of it waited for a drain
                self._runs[key] = drained
            else:
                self._runs[key] = self(fabric, policy)
        return self._runs[key]

    def program(self, defer_dp: bool):
        """The job's program, with the gradient buckets deferred or not (built once)."""
        if defer_dp not in self._programs:
            self._programs[defer_dp] = build_program(self.job, defer_dp=defer_dp)
        return self._programs[defer_dp]

    def __call__(self, fabric: RailFabric, policy: Policy | Plan) -> IterationResult:
        """The photonic (or given fabric's) iteration under ``policy``, or under a Plan given whole (its policy)."""
        plan = policy if isinstance(policy, Plan) else None
        params = plan.policy if plan is not None else policy
        program = self.program(params.defer_dp)
        planner = self._planners.setdefault(params, OpusPlanner(self.job.layout, params))
        key = (params.defer_dp, params.split_pp, replace(fabric, kind="photonic" if fabric.circuits else fabric.kind,
                                                         ocs_delay=0.0, check_in_rtt=0.0, command_latency=0.0,
                                                         revoke_rtt=0.0, drain=True))
        durations = self._durations.setdefault(key, OpDurations(program, fabric))
        return simulate_iteration(program, fabric, plan or params, planner=planner, durations=durations)

    def electrical(self, fabric: RailFabric) -> IterationResult:
        """The baseline: Megatron's own program (buckets overlap the backward) on electrical rails."""
        return simulate_iteration(build_program(self.job), replace(fabric, kind="electrical"))


def overhead_breakdown(runs: JobRuns, fabric: RailFabric, params: Policy | Plan, photonic_s: float,
                       electrical_s: float) -> dict:
    """Photonic minus electrical iteration time, in named parts, by removing one cause at a time.

    - ``control_plane_s``: what a zero-latency controller would save (check-in round trips and the
      command latency);
    - ``switching_delay_s``: then, what a zero-delay switch would save;
    - ``drain_wait_s``: then, what switching under traffic would save (waiting for changing ports, or
      the whole rail under Opus, to carry no traffic);
    - ``lost_overlap_s``: the rest against electrical rails: the program the photonic policy runs
      (deferred DP), phases that cannot share ports and circuit routing. It can be negative.

    The parts sum to ``photonic_s - electrical_s`` exactly (each is a difference of two runs).
    """
    return _parts(photonic_s, electrical_s, *_counterfactuals(runs, fabric, params))


def _counterfactuals(runs: JobRuns, fabric: RailFabric, params: Policy | Plan) -> tuple[float, float, float]:
    """Iteration times without the control plane's latency, then without the switch's delay, then without
    draining (:func:`overhead_breakdown`)."""
    quiet = replace(fabric, check_in_rtt=0.0, command_latency=0.0, revoke_rtt=0.0)
    no_control = runs.run(quiet, params).iteration_time_s
    no_delay = runs.run(replace(quiet, ocs_delay=0.0), params).iteration_time_s
    no_drain = runs.run(replace(quiet, ocs_delay=0.0, drain=False), params).iteration_time_s
    return no_control, no_delay, no_drain


def _parts(photonic_s: float, electrical_s: float, no_control: float, no_delay: float, no_drain: float) -> dict:
    return {"switching_delay_s": no_control - no_delay, "drain_wait_s": no_delay - no_drain,
            "control_plane_s": photonic_s - no_control, "lost_overlap_s": no_drain - electrical_s}


@dataclass(frozen=True, kw_only=True)
class PolicyRun:
    """One policy's photonic iteration against the electrical baseline (a row of the ablation)."""

    policy: str
    iteration_time_s: float
    overhead: float
    reconfigurations_per_iteration: float
    controller_round_trips_per_iteration: float
    overhead_breakdown_s: dict[str, float]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class DelayRun:
    """One (policy, mode, OCS delay) of the delay sweep against the electrical baseline."""

    delay_s: float
    mode: str
    policy: str
    iteration_time_s: float
    overhead: float
    reconfigurations_per_iteration: float
    controller_round_trips_per_iteration: float
    overhead_breakdown_s: dict[str, float]

    def to_dict(self) -> dict:
        return asdict(self)


_CONTEXT = ("built", "runs")
"""Fields of the results below kept for reports (titles, the trace), not part of their JSON."""


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.to_dict() if hasattr(value, "to_dict") else deepcopy(value)


def _to_dict(result) -> dict:
    return {f.name: _plain(getattr(result, f.name)) for f in fields(result) if f.name not in _CONTEXT}


@dataclass(frozen=True, kw_only=True)
class RailsComparison:
    """Electrical rails (the baseline), photonic rails with the scenario's policy, the ideal rail, the
    policy ablation, and power and cost, for one built scenario. Ratios are electrical / photonic."""

    scenario: str
    layout: str
    gpus: int
    reconfig_delay_s: float
    check_in_rtt_s: float
    command_latency_s: float
    routing: str
    sharing: str
    """Ops in flight share links (``fair``) or each runs alone (``none``): the scenario's ``engine.sharing``."""
    collectives: str
    """Collectives priced as NCCL runs them (``nccl``) or by the textbook schedules: ``engine.collectives``."""
    mode: Mode
    policy: str
    iteration_time_s: float
    baseline_iteration_time_s: float
    ideal_iteration_time_s: float
    overhead: float
    reconfigurations_per_iteration: float
    reconfigurations_per_rail: list[int]
    overhead_breakdown_s: dict[str, float]
    controller_round_trips_per_iteration: float
    plan: dict
    program_ops: dict[str, dict[str, int]]
    """The photonic run's program: communication calls by group dimensions and by the Megatron-LM function that
    issues them (:meth:`lightrail.workload.program.Program.op_counts`)."""
    power_ratio: float
    cost_ratio: float
    breakdown: dict[str, dict]
    """Per fabric (electrical, photonic, ideal), its iteration summary."""
    ablation: tuple[PolicyRun, ...]
    costs: dict[str, dict]
    built: Built = field(repr=False, compare=False)
    runs: dict[str, IterationResult] = field(repr=False, compare=False)
    """The electrical, photonic and ideal simulations (events and all)."""

    def rows(self) -> list[dict]:
        """The ablation, one row per policy."""
        return [r.to_dict() for r in self.ablation]

    def trace(self) -> dict:
        """The photonic iteration as a Chrome trace, its metadata carrying the overhead's parts."""
        trace = chrome_trace(self.runs["photonic"], self.built.job.layout)
        trace["metadata"].update(overhead_breakdown_s=dict(self.overhead_breakdown_s),
                                 controller_round_trips_per_iteration=self.controller_round_trips_per_iteration)
        return trace

    def to_dict(self) -> dict:
        return _to_dict(self)


@dataclass(frozen=True, kw_only=True)
class DelaySweep:
    """Overhead of photonic rails against the OCS delay: both policies (lightrail's, the published Opus)
    in every mode, over the electrical baseline."""

    scenario: str
    baseline_iteration_time_s: float
    routing: str
    check_in_rtt_s: float
    command_latency_s: float
    runs: tuple[DelayRun, ...]
    delays: tuple[float, ...] = field(compare=False)
    built: Built = field(repr=False, compare=False)

    @property
    def columns(self) -> list[tuple[str, str]]:
        """(policy, mode) pairs in the order they were run."""
        return list(dict.fromkeys((r.policy, r.mode) for r in self.runs))

    def run(self, policy: str, mode: str, delay: float) -> DelayRun:
        return next(r for r in self.runs if (r.policy, r.mode, r.delay_s) == (policy, mode, delay))

    def rows(self) -> list[dict]:
        return [r.to_dict() for r in self.runs]

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "baseline_iteration_time_s": self.baseline_iteration_time_s,
                "routing": self.routing, "check_in_rtt_s": self.check_in_rtt_s,
                "command_latency_s": self.command_latency_s, "rows": self.rows()}


def compare_rails(built: Built, *, ablation: bool = True,
                  progress: Callable[[str], None] | None = None) -> RailsComparison:
    """Electrical rails (baseline), photonic rails with the scenario's policy, the ideal rail, the
    ablation of policies in the scenario's mode (``ablation=False``: none, most of the work), and power and cost."""
    job, fabric, params = built.job, built.fabric, built.policy
    step = progress or (lambda name: None)
    runs = JobRuns(job)
    with _Ablation(runs, fabric, params, step, on=ablation) as rows:
        electrical = runs.electrical(fabric)
        step("electrical")
        photonic = runs.run(fabric, params)
        base = electrical.iteration_time_s
        breakdown = overhead_breakdown(runs, fabric, params, photonic.iteration_time_s, base)
        step("photonic")
        ideal = runs.run(replace(fabric, kind="ideal"), params)
        step("ideal")
        rows = rows.finish(base)
    lay = job.layout
    costs = compare(lay.world, gpus_per_server=lay.gpus_per_server, rail_speed=built.rail_speed, facts=built.costs)
    return RailsComparison(
        scenario=built.scenario.name,
        layout=str(lay),
        gpus=lay.world,
        reconfig_delay_s=fabric.ocs_delay,
        check_in_rtt_s=fabric.check_in_rtt,
        command_latency_s=fabric.command_latency,
        routing=fabric.routing,
        sharing=fabric.sharing,
        collectives=fabric.collectives,
        mode=params.mode,
        policy=params.label,
        iteration_time_s=photonic.iteration_time_s,
        baseline_iteration_time_s=base,
        ideal_iteration_time_s=ideal.iteration_time_s,
        overhead=photonic.iteration_time_s / base - 1,
        reconfigurations_per_iteration=photonic.reconfigurations_per_iteration,
        reconfigurations_per_rail=photonic.reconfigurations_per_rail,
        overhead_breakdown_s=breakdown,
        controller_round_trips_per_iteration=photonic.controller_round_trips_per_iteration,
        plan=photonic.plan.summary() if photonic.plan is not None else {},
        program_ops=runs.program(params.defer_dp).op_counts(),
        power_ratio=costs.power_ratio,
        cost_ratio=costs.cost_ratio,
        breakdown={name: r.summary() for name, r in
                   (("electrical", electrical), ("photonic", photonic), ("ideal", ideal))},
        ablation=tuple(rows),
        costs={kind: {k: getattr(c, k) for k in ("tiers", "switches", "ocs_ports", "transceivers", "power_w",
                                                   "capex_usd")}
               for kind, c in (("electrical", costs.electrical), ("photonic", costs.photonic))},
        built=built,
        runs={"electrical": electrical, "photonic": photonic, "ideal": ideal},
    )


PARALLEL_GPUS = 4096
"""Jobs of this many GPUs or more run the ablation's policies in worker processes forked as the comparison starts,
while this process simulates the electrical, photonic and ideal runs; a smaller job's whole ablation takes less than
starting them."""

_FORKED: dict = {}
"""What forked ablation workers read (:func:`_forked_rows`): set just before the pool starts, cleared after."""


def _row_runs(runs: JobRuns, fabric: RailFabric, mode: Mode, knobs: dict) -> tuple:
    """One ablation policy's simulations: (iteration time, reconfigurations and controller round trips per
    iteration, and the three counterfactual iteration times); what a worker sends back."""
    policy = replace(ORIGINAL, mode=mode, **knobs)
    r = runs.run(fabric, policy)
    return (r.iteration_time_s, r.reconfigurations_per_iteration, r.controller_round_trips_per_iteration,
            *_counterfactuals(runs, fabric, policy))


def _policy_run(label: str, base: float, raw: tuple) -> PolicyRun:
    seconds, reconfigs, round_trips, *counterfactuals = raw
    return PolicyRun(policy=label, iteration_time_s=seconds, overhead=seconds / base - 1,
                     reconfigurations_per_iteration=reconfigs, controller_round_trips_per_iteration=round_trips,
                     overhead_breakdown_s=_parts(seconds, base, *counterfactuals))


def _forked_rows(indexes: tuple[int, ...]) -> list[tuple]:
    return [_row_runs(*(_FORKED[k] for k in ("runs", "fabric", "mode")), ABLATION[i][1]) for i in indexes]


def _tasks(rows: list[int]) -> list[tuple[int, ...]]:
    """``rows`` of :data:`ABLATION` in tasks for the workers: a row whose policy differs from the previous row's only
    in ``skip_present`` goes with it (one process runs both, so it may take its twin's runs, ``JobRuns.run``)."""
    tasks: list[tuple[int, ...]] = []
    for i in rows:
        knobs = {**ABLATION[i][1], "skip_present": False}
        if tasks and {**ABLATION[tasks[-1][-1]][1], "skip_present": False} == knobs:
            tasks[-1] += (i,)
        else:
            tasks.append((i,))
    return tasks


class _Ablation:
    """The ablation's rows in :data:`ABLATION`'s order. On big jobs, the policies whose program or op durations
    differ from the scenario policy's go to forked workers (one per core; twins differing only in ``skip_present``
    together, :func:`_tasks`) as the comparison starts, and run while
    this process simulates the electrical, photonic and ideal runs; the rest (sharing this process's program and
    durations, or the scenario's own policy) run here after them. The rows equal what one process computes (each
    simulation is deterministic)."""

    def __init__(self, runs: JobRuns, fabric: RailFabric, params: Policy, step: Callable[[str], None], *, on: bool):
        self.runs, self.fabric, self.params, self.step, self.on = runs, fabric, params, step, on
        self.pool, self.pending = None, {}

    def __enter__(self) -> _Ablation:
        import os

        workers = os.cpu_count() or 1
        if not self.on or self.runs.job.layout.world < PARALLEL_GPUS or workers < 2:
            return self  # no ablation to fork for (--no-ablation: nor multiprocessing to import, issue 33)
        import multiprocessing

        if "fork" not in multiprocessing.get_all_start_methods():
            return self
        from concurrent.futures import ProcessPoolExecutor

        shared = (self.params.defer_dp, self.params.split_pp)
        away = [i for i, (_, knobs) in enumerate(ABLATION)
                if (knobs.get("defer_dp", False), knobs.get("split_pp", False)) != shared]
        if not away:
            return self
        _FORKED.update(runs=self.runs, fabric=self.fabric, mode=self.params.mode)
        tasks = _tasks(away)
        try:  # forked now: the workers start from this process's state before its own simulations
            self.pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context("fork"))
            self.pending = {task: self.pool.submit(_forked_rows, task) for task in tasks}
        finally:
            _FORKED.clear()
        return self

    def finish(self, base: float) -> list[PolicyRun]:
        if not self.on:
            return []
        rows: list[PolicyRun | None] = [None] * len(ABLATION)
        away = {i for task in self.pending for i in task}
        for i, (label, knobs) in enumerate(ABLATION):
            if i not in away:
                rows[i] = _policy_run(label, base, _row_runs(self.runs, self.fabric, self.params.mode, knobs))
                self.step(label)
        for task, future in self.pending.items():
            for i, raw in zip(task, future.result(), strict=True):
                rows[i] = _policy_run(ABLATION[i][0], base, raw)
                self.step(ABLATION[i][0])
        return rows

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=exc[0] is None, cancel_futures=exc[0] is not None)


def delay_sweep(built: Built, delays: Sequence[float], *,
                modes: Sequence[Mode] = (Mode.ON_DEMAND, Mode.PROVISIONED),
                progress: Callable[[str], None] | None = None) -> DelaySweep:
    """Overhead of photonic rails (scenario policy, and the published Opus) against the OCS delay, with
    each run's overhead broken down (``overhead_breakdown``)."""
    job, fabric, params = built.job, built.fabric, built.policy
    runs = JobRuns(job)
    base = runs.electrical(fabric).iteration_time_s
    rows = []
    for policy_name, policy in (("lightrail", params), ("opus", ORIGINAL)):
        for mode in modes:
            for delay in delays:
                at, knobs = replace(fabric, ocs_delay=delay), replace(policy, mode=mode)
                r = runs.run(at, knobs)
                rows.append(DelayRun(delay_s=delay, mode=str(mode), policy=policy_name,
                                     iteration_time_s=r.iteration_time_s, overhead=r.iteration_time_s / base - 1,
                                     reconfigurations_per_iteration=r.reconfigurations_per_iteration,
                                     controller_round_trips_per_iteration=r.controller_round_trips_per_iteration,
                                     overhead_breakdown_s=overhead_breakdown(runs, at, knobs, r.iteration_time_s,
                                                                             base)))
                if progress:
                    progress(f"{policy_name} {mode} {delay:g}s")
    return DelaySweep(scenario=built.scenario.name, baseline_iteration_time_s=base, routing=fabric.routing,
                      check_in_rtt_s=fabric.check_in_rtt, command_latency_s=fabric.command_latency,
                      runs=tuple(rows), delays=tuple(delays), built=built)
