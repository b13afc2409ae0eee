"""The emulation's terms of the iteration model: compute on a host's shared cores (``RailFabric.host_cores``:
processor sharing of every rank's process) and the controller's lag from a switch's end to its grant
(``RailFabric.switch_grant_latency``), checked against closed forms on small programs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightrail.control.opus import LIGHTRAIL
from lightrail.errors import ScenarioError
from lightrail.fabric.params import RailFabric
from lightrail.scenario import parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload.program import ComputeOp, Program, build_program


def _job(gpus: int):
    return parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 2}},
                           "cluster": {"gpus": gpus, "gpus_per_server": 1}, "parallel": {"pp": 2},
                           "job": {"micro_batches": 2}}).build().job


def _compute_only(gpus: int, stage0: list[float], stage1: list[float]) -> Program:
    """Two stages that only compute (no communication: nothing but the cores links them)."""
    return Program(_job(gpus), (tuple(ComputeOp(s, f"a{i}") for i, s in enumerate(stage0)),
                                tuple(ComputeOp(s, f"b{i}") for i, s in enumerate(stage1))))


ELECTRICAL = RailFabric(kind="electrical")


@pytest.mark.parametrize("gpus, cores, expected", [
    (2, None, 2.0),   # an accelerator per rank: the longer stage
    (2, 2, 2.0),      # a core per rank: the same
    (2, 1, 2.5),      # two processes on one core: work-conserving, all the work on one core
    (4, 1, 5.0),      # four processes (two per stage) on one core: 2 x 2.5
    (4, 2, 2.5),      # four on two cores: two cores' worth of work at a time
])
def test_compute_shares_the_host_cores_as_processor_sharing(gpus, cores, expected):
    """Stage 0 computes 1 s then 1 s, stage 1 0.5 s (per rank, on a core of its own). On ``c`` cores with ``r`` ranks
    per stage, ``n`` busy stages each run at ``min(1, c / (n r))`` of a core: while both compute the 0.5 s takes
    twice as long, then stage 0 runs alone (faster)."""
    program = _compute_only(gpus, [1.0, 1.0], [0.5])
    r = simulate_iteration(program, replace(ELECTRICAL, host_cores=cores))
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-12)


def test_a_stage_alone_computes_faster_than_two_at_once():
    """One core, a rank per stage: while both compute, each takes twice its time; stage 0's second op, alone, its
    own time. Stage 1's 0.5 s ends at 1.0 s; stage 0's first op at 1.5 s (0.5 s done by 1.0 s, the rest alone)."""
    program = _compute_only(2, [1.0, 1.0], [0.5])
    r = simulate_iteration(program, replace(ELECTRICAL, host_cores=1))
    spans = {e.name: (e.start, e.start + e.duration) for e in r.events if e.category == "compute"}
    t0 = spans["a0"][0]
    assert [v - t0 for v in spans["b0"]] == pytest.approx([0.0, 1.0], abs=1e-12)
    assert [v - t0 for v in spans["a0"]] == pytest.approx([0.0, 1.5], abs=1e-12)
    assert [v - t0 for v in spans["a1"]] == pytest.approx([1.5, 2.5], abs=1e-12)
    assert [st["compute_s"] for st in r.stages] == pytest.approx([2.5, 1.0])  # the time it took, not the work


def test_host_cores_is_checked():
    with pytest.raises(ScenarioError, match="host_cores"):
        RailFabric(host_cores=0)


def _two_phases(delay: str, mode: str, peak: float):
    """pp and dp on the same ports (4 GPUs, one per server): every iteration switches pp -> dp -> pp."""
    built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 2}},
                            "cluster": {"gpus": 4, "gpus_per_server": 1, "gpu": "h100", "peak_tflops": peak},
                            "parallel": {"pp": 2, "dp": 2},
                            "job": {"micro_batches": 2, "schedule": "gpipe", "megatron_step": False},
                            "ocs": {"reconfig_delay": delay, "check_in_rtt": "1ms", "command_latency": "0s",
                                    "revoke_rtt": "0s", "mode": mode}}).build()
    return built, build_program(built.job, defer_dp=True)


def _wait(r) -> float:
    """From the end of stage 0's first forward to the start of its send."""
    (f0,) = [e for e in r.events if e.track == "stage 0" and e.name == "F0"]
    send = min(e.start for e in r.events if e.track == "stage 0" and e.name == "F0 act" and e.category == "pp")
    return send - (f0.start + f0.duration)


def test_the_grant_after_a_switch_waits_the_controllers_lag():
    """On demand the first send of the iteration waits for its pp switch: it is granted the lag after the switch
    ends (plus half a round trip), so the send starts exactly the lag later."""
    built, program = _two_phases("10ms", "on-demand", 1.0)
    policy = replace(LIGHTRAIL, mode="on-demand", split_pp=False)
    base = simulate_iteration(program, built.fabric, policy)
    lag = simulate_iteration(program, replace(built.fabric, switch_grant_latency=3e-3), policy)
    # F0 ends, the acquire reaches the controller half a round trip later and starts the switch (command 0); the
    # grant comes the lag after its end, and reaches the rank half a round trip later
    assert _wait(base) == pytest.approx(1e-3 + 10e-3, rel=1e-9)
    assert _wait(lag) == pytest.approx(1e-3 + 10e-3 + 3e-3, rel=1e-9)


def test_a_switch_over_before_the_acquire_adds_no_lag():
    """Provisioned, with compute longer than the switch: the pp switch, prepared as dp ended, is over before the
    first send asks, which is granted at once (a round trip): the lag does not show."""
    built, program = _two_phases("1ms", "provisioned", 1e-4)
    policy = replace(LIGHTRAIL, mode="provisioned", split_pp=False)
    base = simulate_iteration(program, built.fabric, policy)
    lag = simulate_iteration(program, replace(built.fabric, switch_grant_latency=3e-3), policy)
    (f0,) = [e for e in base.events if e.track == "stage 0" and e.name == "F0"]
    assert f0.duration > 20e-3  # long enough to hide the switch
    assert _wait(base) == pytest.approx(1e-3, rel=1e-9)
    assert _wait(lag) == pytest.approx(1e-3, rel=1e-9)


@pytest.mark.parametrize("leases, per_stage, per_group", [(True, 3, 4), (False, 4, 6)])
def test_switches_are_also_counted_per_group_as_the_controller_counts_them(leases, per_stage, per_group):
    """The train-demo's job (tp = dp = pp = 2, 2 GPUs per server: 2 rails of 4 ports). Per rail and iteration the
    model switches once per stage's phase: pp (both directions leased, or forward and backward apart), then each
    stage's dp. The controller switches each group: 2 pipeline pairs per rail and direction, 1 dp ring per stage."""
    built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 4}},
                            "cluster": {"gpus": 8, "gpus_per_server": 2}, "parallel": {"tp": 2, "pp": 2, "dp": 2},
                            "job": {"micro_batches": 4, "schedule": "gpipe", "megatron_step": False, "dp_buckets": 1},
                            "ocs": {"reconfig_delay": "10ms"}}).build()
    policy = replace(LIGHTRAIL, mode="on-demand", split_pp=False, leases=leases)
    r = simulate_iteration(build_program(built.job, defer_dp=True), built.fabric, policy)
    assert r.reconfigurations_per_rail == [per_stage, per_stage]
    assert r.group_reconfigurations_per_rail == [per_group, per_group]
    electrical = simulate_iteration(build_program(built.job), replace(built.fabric, kind="electrical"))
    assert electrical.group_reconfigurations_per_rail == [0, 0]
