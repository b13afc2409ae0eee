"""What photonic rails do to a training job: electrical vs photonic vs ideal, the policy ablation,
power and cost, and the reconfiguration-delay sweep. Pure functions over a built scenario."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from lightrail.control.opus import ORIGINAL, OpusParams
from lightrail.sim.cost import compare
from lightrail.sim.iteration import IterationResult, RailFabric, simulate_iteration
from lightrail.workload.program import build_program

__all__ = ["ABLATION", "compare_rails", "delay_sweep"]

ABLATION: tuple[tuple[str, dict], ...] = (
    ("opus (original)", {}),
    ("+ skip if present", {"skip_present": True}),
    ("+ partial reconfiguration", {"skip_present": True, "partial": True}),
    ("+ split pipeline rails", {"skip_present": True, "partial": True, "split_pp": True}),
    ("+ deferred DP buckets", {"skip_present": True, "partial": True, "split_pp": True, "defer_dp": True}),
)
"""Policies from the published Opus to all of lightrail's improvements, each adding one."""


def _run(job, fabric: RailFabric, params: OpusParams) -> IterationResult:
    return simulate_iteration(build_program(job, defer_dp=params.defer_dp), fabric, params)


def _electrical(job, fabric: RailFabric) -> IterationResult:
    """The baseline: Megatron's own program (buckets overlap the backward) on electrical rails."""
    return simulate_iteration(build_program(job), replace(fabric, kind="electrical"))


def compare_rails(built, *, progress: Callable[[str], None] | None = None) -> dict:
    """Electrical rails (baseline), photonic rails with the scenario's policy, the ideal rail, the
    ablation of policies in the scenario's mode, and power and cost; one JSON-ready dict."""
    job, fabric, params = built.job, built.fabric, built.params
    step = progress or (lambda name: None)
    electrical = _electrical(job, fabric)
    step("electrical")
    photonic = _run(job, fabric, params)
    step("photonic")
    ideal = _run(job, replace(fabric, kind="ideal"), params)
    step("ideal")
    base = electrical.iteration_time_s
    ablation = []
    for label, knobs in ABLATION:
        policy = replace(ORIGINAL, mode=params.mode, **knobs)
        r = _run(job, fabric, policy)
        ablation.append({"policy": label, "iteration_time_s": r.iteration_time_s,
                         "overhead": r.iteration_time_s / base - 1,
                         "reconfigurations_per_iteration": r.reconfigurations_per_iteration})
        step(label)
    lay = job.layout
    costs = compare(lay.world, gpus_per_server=lay.gpus_per_server, rail_speed=built.rail_speed, facts=built.costs)
    return {
        "scenario": built.scenario.name,
        "layout": str(lay),
        "gpus": lay.world,
        "reconfig_delay_s": fabric.reconfig_delay,
        "mode": params.mode,
        "policy": params.label,
        "iteration_time_s": photonic.iteration_time_s,
        "baseline_iteration_time_s": base,
        "ideal_iteration_time_s": ideal.iteration_time_s,
        "overhead": photonic.iteration_time_s / base - 1,
        "reconfigurations_per_iteration": photonic.reconfigurations_per_iteration,
        "reconfigurations_per_rail": photonic.reconfigurations_per_rail,
        "power_ratio": costs.power_ratio,
        "cost_ratio": costs.cost_ratio,
        "breakdown": {name: r.summary() for name, r in
                      (("electrical", electrical), ("photonic", photonic), ("ideal", ideal))},
        "ablation": ablation,
        "costs": {kind: {k: getattr(c, k) for k in ("tiers", "switches", "ocs_ports", "transceivers", "power_w",
                                                      "capex_usd")}
                  for kind, c in (("electrical", costs.electrical), ("photonic", costs.photonic))},
        "_results": {"electrical": electrical, "photonic": photonic, "ideal": ideal},
    }


def delay_sweep(built, delays: Sequence[float], *, modes: Sequence[str] = ("on_demand", "provisioned"),
                progress: Callable[[str], None] | None = None) -> dict:
    """Overhead of photonic rails (scenario policy, and the original Opus) against the OCS delay."""
    job, fabric, params = built.job, built.fabric, built.params
    base = _electrical(job, fabric).iteration_time_s
    rows = []
    for policy_name, policy in (("lightrail", params), ("opus", ORIGINAL)):
        for mode in modes:
            for delay in delays:
                r = _run(job, replace(fabric, reconfig_delay=delay), replace(policy, mode=mode))
                rows.append({"delay_s": delay, "mode": mode.replace("_", "-"), "policy": policy_name,
                             "iteration_time_s": r.iteration_time_s, "overhead": r.iteration_time_s / base - 1,
                             "reconfigurations_per_iteration": r.reconfigurations_per_iteration})
                if progress:
                    progress(f"{policy_name} {mode} {delay:g}s")
    return {"scenario": built.scenario.name, "baseline_iteration_time_s": base, "rows": rows}
