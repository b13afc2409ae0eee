"""The train-demo's prediction: the same job, layout, GPipe schedule and Plan as the run, simulated with the
run's own measurements (its compute rate from the gloo run, its control-plane costs from the controller, the
emulation host's cores) so the model's overhead can be set beside the measured one (``measure``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from lightrail.control.opus import OpusPlanner
from lightrail.control.plan import Plan, Policy
from lightrail.errors import InfeasibleError
from lightrail.studies.train_demo.config import DemoConfig

__all__ = ["DEMO_POLICY", "Prediction", "demo_plan", "predicted_overhead", "calibrated_peak_tflops",
           "measured_control", "host_cores"]


DEMO_POLICY = Policy(split_pp=False)
"""The policy the lightrail backend carries out: per group (partial), skip-if-present, a transfer on the rail of
its destination GPU (pipeline rails not split), the DP all-reduce after the last pipeline op; train-demo's
``--mode`` and ``--leases`` replace those two fields."""


def _scenario(config: DemoConfig, *, gpus_per_server: int, ocs_delay: float, policy: Policy,
              peak_tflops: float | None, control: Mapping[str, float] | None = None):
    from lightrail.scenario import parse_scenario

    ocs = {"reconfig_delay": f"{ocs_delay}s", **policy.to_dict(),
           **{name: f"{seconds}s" for name, seconds in (control or {}).items()}}
    cluster = {"gpus": config.world, "gpus_per_server": gpus_per_server}
    if peak_tflops is not None:
        cluster["peak_tflops"] = peak_tflops
    return parse_scenario({
        "name": "train-demo",
        "model": {"preset": "debug", "overrides": {"layers": config.layers, "hidden": config.d_model,
                                                   "ffn": 4 * config.d_model, "heads": config.heads,
                                                   "kv_heads": config.heads, "vocab": config.vocab,
                                                   "seq_len": config.seq}},
        "cluster": cluster,
        "parallel": {"tp": config.tp, "pp": config.pp, "dp": config.dp},
        "job": {"micro_batches": config.microbatches, "micro_batch_size": config.micro_batch, "dp_buckets": 1,
                "grad_bytes": 4, "schedule": "gpipe",  # the demo runs GPipe, fp32 gradients in one bucket,
                # and after the backward only that bucket's all-reduce (train_demo.train_worker): no grad-norm,
                # no loss all-reduce, which Megatron's step adds (a tp+pp phase across servers)
                "megatron_step": False},
        "ocs": ocs,
    })


def calibrated_peak_tflops(config: DemoConfig, *, gpus_per_server: int, iteration_s: float,
                           host_cores: int | None = None) -> float:
    """The per-rank peak (TFLOP/s) at which ``simulate``'s electrical iteration of the demo job takes
    ``iteration_s``: our own measurement of this CPU (the gloo run), not a hardware figure.

    The model's iteration is ``a / peak + b`` (compute, and communication at the cluster's rates),
    so two electrical simulations give ``a`` and ``b``. What the CPU spends in gloo's loopback
    transfers is folded into the compute rate. With ``host_cores`` (the ranks' processes share that many
    cores: ``RailFabric.host_cores``) the compute is timed under processor sharing; the fit is then refined
    by secant steps (the iteration is ``a / peak + b`` only while the stages' overlaps keep their order).
    """
    from lightrail.studies.rails import JobRuns

    def electrical(peak: float) -> float:
        built = _scenario(config, gpus_per_server=gpus_per_server, ocs_delay=0.0, policy=DEMO_POLICY,
                          peak_tflops=peak).build()
        return JobRuns(built.job).electrical(replace(built.fabric, host_cores=host_cores)).iteration_time_s

    p1, p2 = 1e-3, 2e-3
    t1, t2 = electrical(p1), electrical(p2)
    a = (t1 - t2) / (1 / p1 - 1 / p2)
    b = t1 - a / p1
    if a <= 0 or iteration_s <= b:
        raise InfeasibleError(f"cannot fit the model's compute to a measured iteration of {iteration_s:.4g} s",
                              field="gloo_iteration_s", fix="run more --steps")
    peak = a / (iteration_s - b)
    if host_cores is not None:  # secant steps on 1 / peak (the compute time scale) to the measured iteration
        x0, f0 = 1 / p2, t2 - iteration_s
        x1 = 1 / peak
        for _ in range(6):
            f1 = electrical(1 / x1) - iteration_s
            if abs(f1) <= 1e-6 * iteration_s or f1 == f0:
                break
            x0, x1, f0 = x1, max(x1 - f1 * (x1 - x0) / (f1 - f0), 1e-9), f1
        peak = 1 / x1
    return peak


@dataclass(frozen=True)
class Prediction:
    """What ``simulate`` predicts for the demo job (see :func:`predicted_overhead`)."""

    iteration_s: float
    electrical_iteration_s: float
    overhead_s: float
    reconfigurations_per_rail_per_iteration: float
    controller_round_trips_per_iteration: float | None
    overhead_breakdown_s: Mapping[str, float]
    peak_tflops: float | None
    """The per-rank compute rate the model ran at (calibrated on the gloo run), or None: the preset's."""
    check_in_rtt_s: float | None
    leases: bool
    schedule: str
    revoke_rtt_s: float | None = None
    command_latency_s: float | None = None
    """The run's own control-plane costs the model used (``ocs.revoke_rtt``, ``ocs.command_latency``; None: the
    defaults), as :func:`measured_control` reads them from the controller."""
    controller_requests_per_iteration: float | None = None
    """Requests per rank per iteration as the runtime counts them (acquires, releases, acks, prepares)."""
    switch_grant_latency_s: float | None = None
    """The run's own lag from a switch's end to its grant (``ocs.switch_grant_latency``; None: the default)."""
    host_cores: int | None = None
    """The cores the ranks' processes shared (``RailFabric.host_cores``: compute under processor sharing), or None."""
    host_work_s: float | None = None
    """CPU seconds per iteration the control plane (the controller, the ranks' clients) spent on those cores
    (measured), or None."""
    group_reconfigurations_per_rail_per_iteration: float | None = None
    """Switches per rail as the controller counts them, one per group (``reconfigurations_per_rail_per_iteration``
    counts one per stage's switch, which changes several groups' circuits at once)."""

    def to_dict(self) -> dict:
        return {"iteration_s": self.iteration_s, "electrical_iteration_s": self.electrical_iteration_s,
                "overhead_s": self.overhead_s,
                "reconfigurations_per_rail_per_iteration": self.reconfigurations_per_rail_per_iteration,
                "controller_round_trips_per_iteration": self.controller_round_trips_per_iteration,
                "overhead_breakdown_s": dict(self.overhead_breakdown_s), "peak_tflops": self.peak_tflops,
                "check_in_rtt_s": self.check_in_rtt_s, "leases": self.leases, "schedule": self.schedule,
                "revoke_rtt_s": self.revoke_rtt_s, "command_latency_s": self.command_latency_s,
                "controller_requests_per_iteration": self.controller_requests_per_iteration,
                "switch_grant_latency_s": self.switch_grant_latency_s, "host_cores": self.host_cores,
                "host_work_s": self.host_work_s,
                "group_reconfigurations_per_rail_per_iteration": self.group_reconfigurations_per_rail_per_iteration}


def demo_plan(config: DemoConfig, *, gpus_per_server: int, policy: Policy = DEMO_POLICY) -> Plan:
    """The one Plan of a train-demo run: the planner's, for the demo job's program under ``policy``. The torch
    backend executes it (``BackendConfig.plan``, pickled to the workers) and the prediction simulates it."""
    from lightrail.studies.rails import JobRuns

    built = _scenario(config, gpus_per_server=gpus_per_server, ocs_delay=0.0, policy=policy,
                      peak_tflops=None).build()
    return OpusPlanner(built.job.layout, policy).plan(JobRuns(built.job).program(policy.defer_dp))


def predicted_overhead(config: DemoConfig, *, gpus_per_server: int, ocs_delay: float, plan: Plan,
                       peak_tflops: float | None = None, control: Mapping[str, float] | None = None,
                       host_cores: int | None = None, host_work_s: float | None = None) -> Prediction:
    """What ``lightrail simulate`` predicts for the same model, layout, micro-batches, pipeline schedule
    (GPipe) and OCS delay, executing ``plan`` (:func:`demo_plan`: its configurations and policy). With
    ``peak_tflops`` (see :func:`calibrated_peak_tflops`) the model computes at this CPU's speed, so its overhead
    can be set beside the measured one; with ``control`` (:func:`measured_control`: ``check_in_rtt``,
    ``revoke_rtt``, ``command_latency``, ``switch_grant_latency`` in seconds) the controller costs what it cost in
    the run; with ``host_cores`` the ranks compute on that many shared cores, as the emulation does
    (``RailFabric.host_cores``), and ``host_work_s`` is the CPU time per iteration another process on those cores
    spent (the controller's, measured in the run): the host does that much more work at the same rate while the
    ranks keep its cores busy, so the iteration is ``host_work_s / host_cores`` longer (``host_cpu_s`` in the
    breakdown)."""
    from lightrail.studies.rails import JobRuns, overhead_breakdown

    control = dict(control or {})
    after = control.pop("switch_grant_latency", None)  # the fabric's, not a scenario field
    built = _scenario(config, gpus_per_server=gpus_per_server, ocs_delay=ocs_delay, policy=plan.policy,
                      peak_tflops=peak_tflops, control=control).build()
    fabric = replace(built.fabric, host_cores=host_cores,
                     **({} if after is None else {"switch_grant_latency": after}))
    runs = JobRuns(built.job)  # the photonic run and its electrical baseline, as `simulate` computes them
    result = runs(fabric, plan)
    photonic, electrical = result.iteration_time_s, runs.electrical(fabric).iteration_time_s
    host_cpu = (host_work_s or 0.0) / host_cores if host_cores else 0.0
    breakdown = {**overhead_breakdown(runs, fabric, plan, photonic, electrical), "host_cpu_s": host_cpu}
    photonic += host_cpu
    return Prediction(photonic, electrical, photonic - electrical, result.reconfigurations_per_iteration,
                      result.controller_round_trips_per_iteration, breakdown, peak_tflops,
                      control.get("check_in_rtt"), plan.leases, "gpipe", control.get("revoke_rtt"),
                      control.get("command_latency"), result.controller_requests_per_iteration, after, host_cores,
                      host_work_s, result.group_reconfigurations_per_iteration)


def host_cores() -> int:
    """The CPU cores this process (and the ranks it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def measured_control(metrics: Mapping[str, float], round_trips: Sequence[float], *, leases: bool) -> dict[str, float]:
    """The run's control-plane costs as the model's ``ocs`` parameters, from the controller's /metrics and the ranks'
    request round trips: ``check_in_rtt`` the ranks' mean request round trip (less its top 1%); ``revoke_rtt`` the
    controller's median revocation (push to the lease's end); ``switch_grant_latency`` its median lag from a switch's
    end to the grant (``lightrail_switch_lag_seconds{kind="after"}``: where that lag acts, after the switch);
    ``command_latency`` its median switch overhead (from a group ready to its grant, less the OCS delay) less that
    lag and, with leases, the revocation the switch waited for. A cost the run did not incur is left to the default.

    The round trip is a mean: a rank checks in several times per iteration (twice with leases, nine times without,
    on the demo job), and the expected sum of those is the sum of their means; on a busy host the mean is up to
    twice the median. Its top 1% are left out: a few replies (up to 0.6 s) wait across the other replicas' turns,
    which no measured iteration contains. The controller's costs come once or twice per iteration, and it reports
    quantiles over its samples (its ``_sum`` holds the same turn-crossing outliers): medians."""
    out: dict[str, float] = {}
    if round_trips:
        kept = sorted(round_trips)[: max(1, len(round_trips) - len(round_trips) // 100)]
        out["check_in_rtt"] = statistics.fmean(kept)
    revoke = metrics.get('lightrail_revoke_seconds{quantile="0.5"}')
    if revoke is not None:
        out["revoke_rtt"] = revoke
    after = metrics.get('lightrail_switch_lag_seconds{kind="after",quantile="0.5"}')
    if after is not None:
        out["switch_grant_latency"] = after
    overhead = metrics.get('lightrail_grant_overhead_seconds{kind="switch",quantile="0.5"}')
    if overhead is not None:
        out["command_latency"] = max(0.0, overhead - (after or 0.0) - ((revoke or 0.0) if leases else 0.0))
    return out
