"""A send checks in with its receiver: the pair is one group, granted once both ranks asked (the torch backend's
acquire barrier), the receiver when it reaches its receive; the requests a rank sends are counted as the runtime
counts them; and no pipeline schedule deadlocks on the barrier (a send and the receive after it are posted
together, as Megatron batches them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightrail.control.opus import LIGHTRAIL, ORIGINAL
from lightrail.scenario import parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload.program import ComputeOp, build_program

RTT = 1e-3


def _uneven(**job):
    """Two stages, one GPU per server, the second stage three times the first's layers: the receiver is busy."""
    built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 4}},
                            "cluster": {"gpus": 2, "gpus_per_server": 1, "gpu": "h100", "peak_tflops": 0.01},
                            "parallel": {"pp": 2},
                            "job": {"micro_batches": 2, "schedule": "gpipe", "megatron_step": False,
                                    "pipeline_layers": [1, 3], **job},
                            "ocs": {"reconfig_delay": "0s", "check_in_rtt": f"{RTT}s", "command_latency": "0s",
                                    "revoke_rtt": "0s", "mode": "on-demand"}}).build()
    return built, build_program(built.job, defer_dp=True)


def _events(result, track, name):
    return [e for e in result.events if e.track == track and e.name == name]


def test_a_send_is_granted_when_its_busy_receiver_checks_in():
    built, program = _uneven()
    r = simulate_iteration(program, built.fabric, replace(ORIGINAL, mode="on-demand"))
    (f0,) = _events(r, "stage 1", "F0")  # stage 1's first forward: it reaches "recv F1" when it ends
    (send,) = _events(r, "stage 0", "F1 act")
    (wait,) = _events(r, "stage 0", "F1 act: receiver's check-in")
    assert f0.start + f0.duration > wait.start  # the receiver was still computing when the send checked in
    assert send.start == pytest.approx(f0.start + f0.duration + RTT, rel=1e-12)  # its acquire's round trip
    assert wait.start + wait.duration == pytest.approx(send.start, rel=1e-12)
    # every op on the rails checks in, both ranks of a pair: 2 sends and 2 receives per stage
    assert [st["round_trips"] for st in r.stages] == [4, 4]
    assert r.controller_requests_per_iteration == 8  # an acquire and a release each


def test_leases_check_in_once_per_phase_and_ack_each_revoke():
    """Two phases on the same ports (pp, and dp over two pipelines): each rank checks in once per phase and
    iteration, and each of its leases is revoked once (an ack); provisioned adds a prepare per new phase."""
    built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 2}},
                            "cluster": {"gpus": 4, "gpus_per_server": 1, "gpu": "h100", "peak_tflops": 0.01},
                            "parallel": {"pp": 2, "dp": 2},
                            "job": {"micro_batches": 2, "schedule": "gpipe", "megatron_step": False},
                            "ocs": {"reconfig_delay": "1ms"}}).build()
    program = build_program(built.job, defer_dp=True)
    for mode, prepares in (("on-demand", 0), ("provisioned", 2)):
        r = simulate_iteration(program, built.fabric, replace(LIGHTRAIL, mode=mode, split_pp=False))
        assert [st["round_trips"] for st in r.stages] == [2, 2]
        assert [st["requests"] for st in r.stages] == [2 + 2 + prepares] * 2  # acquires, acks, prepares


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
@pytest.mark.parametrize("policy", [ORIGINAL, LIGHTRAIL])
def test_no_schedule_deadlocks_on_the_barrier_and_every_stage_runs_its_compute(schedule, policy):
    built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 8}},
                            "cluster": {"gpus": 16, "gpus_per_server": 2}, "parallel": {"tp": 2, "pp": 4, "dp": 2},
                            "job": {"micro_batches": 8, "schedule": schedule,
                                    "virtual_stages": 2 if schedule == "interleaved" else 1}}).build()
    program = build_program(built.job, defer_dp=policy.defer_dp)
    r = simulate_iteration(program, built.fabric, policy)
    for stage, ops in zip(r.stages, program.stages, strict=True):
        assert stage["compute_s"] == pytest.approx(sum(op.seconds for op in ops if isinstance(op, ComputeOp)))
    assert r.iteration_time_s > 0
