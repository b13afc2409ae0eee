"""Opus planner and the iteration simulator: the checks the photonic-rails issue names, and exact
small cases where the answer can be worked out by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lightrail.control.opus import LIGHTRAIL, ORIGINAL, OpusParams, OpusPlanner, is_rail_configuration
from lightrail.fabric.params import FabricKind, RailFabric
from lightrail.scenario import parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.sim.trace import chrome_trace
from lightrail.workload.parallel import Dim
from lightrail.workload.program import CollectiveOp, SendOp, build_program

DELAYS = [0.0, 1e-4, 1e-3, 10e-3, 50e-3, 250e-3]
POLICIES = {"original": ORIGINAL, "lightrail": LIGHTRAIL,
            "partial-only": replace(ORIGINAL, partial=True, skip_present=True)}


def built(**sections):
    base = {"name": "t", "model": "llama3-8b", "cluster": {"gpus": 64, "gpu": "h100"},
            "parallel": {"tp": 8, "pp": 4, "dp": 2}, "job": {"micro_batches": 6, "dp_buckets": 2}}
    base.update(sections)
    return parse_scenario(base).build()


JOBS = {
    "pp4": built(),
    "opus16": built(model="llama3-8b", cluster={"gpus": 16, "gpus_per_server": 4, "gpu": "a100"},
                    parallel={"tp": 4, "pp": 2, "dp": 2}, job={"micro_batches": 8}),
    "cp-zero": built(parallel={"tp": 4, "cp": 2, "pp": 2, "dp": 4}, job={"micro_batches": 4, "zero": True}),
    "moe-ep": built(model={"preset": "mixtral-8x7b", "overrides": {"layers": 4}},
                    cluster={"gpus": 64, "gpu": "h100"}, parallel={"tp": 4, "ep": 8, "pp": 2, "dp": 1},
                    job={"micro_batches": 2}),
}


def run(b, *, kind="photonic", delay=10e-3, params=LIGHTRAIL, control=None):
    """One steady-state iteration; ``control`` = (check-in round trip, command latency), default the fabric's."""
    fabric = replace(b.fabric, kind=kind, ocs_delay=delay)
    if control is not None:
        fabric = replace(fabric, check_in_rtt=control[0], command_latency=control[1], revoke_rtt=control[0])
    return simulate_iteration(build_program(b.job, defer_dp=params.defer_dp), fabric, params)


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("mode", ["on_demand", "provisioned"])
def test_zero_delay_photonic_equals_the_ideal_rail(job, policy, mode):
    params = replace(POLICIES[policy], mode=mode)
    photonic = run(JOBS[job], delay=0.0, params=params, control=(0.0, 0.0))
    ideal = run(JOBS[job], kind="ideal", delay=0.5, params=params)  # the ideal rail ignores the delay
    assert photonic.iteration_time_s == pytest.approx(ideal.iteration_time_s, rel=1e-12)


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_overhead_never_decreases_with_delay_and_provisioned_never_loses(job, policy):
    times = {}
    for mode in ("on_demand", "provisioned"):
        params = replace(POLICIES[policy], mode=mode)
        times[mode] = [run(JOBS[job], delay=d, params=params).iteration_time_s for d in DELAYS]
        assert all(a <= b * (1 + 1e-12) for a, b in zip(times[mode], times[mode][1:], strict=False)), times[mode]
    for on_demand, provisioned in zip(times["on_demand"], times["provisioned"], strict=True):
        assert provisioned <= on_demand * (1 + 1e-12)


def test_a_data_parallel_only_job_never_reconfigures():
    b = built(parallel={"tp": 8, "pp": 1, "dp": 8})
    for params in (ORIGINAL, LIGHTRAIL, replace(LIGHTRAIL, mode="on_demand")):
        r = run(b, delay=50e-3, params=params)
        assert r.reconfigurations_per_rail == [0] * 8
        # the step's loss all-reduce is a second DP-phase op: its check-in splits into control and circuit wait
        # with a rounding of ~1e-16 s (no switch happens: reconfigurations_per_rail above)
        assert r.reconfiguration_s == pytest.approx(0, abs=1e-15)
        ideal = run(b, kind="ideal", params=params).iteration_time_s
        assert run(b, delay=50e-3, params=params, control=(0.0, 0.0)).iteration_time_s == pytest.approx(ideal)
        if params.leases:  # the lease outlives the iteration: no round trip in steady state
            assert r.controller_round_trips_per_iteration == 0
            assert r.iteration_time_s == pytest.approx(ideal)
        else:  # Opus: one check-in per DP bucket, each a round trip on the critical path at the end
            assert r.controller_round_trips_per_iteration == b.job.dp_buckets
            assert r.iteration_time_s > ideal


def test_electrical_rails_never_reconfigure():
    r = run(JOBS["pp4"], kind="electrical")
    assert r.reconfigurations_per_rail == [0] * 8 and r.reconfiguration_s == 0


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_phase_configuration_is_one_circuit_per_port_on_every_rail(job):
    b = JOBS[job]
    for params in (ORIGINAL, LIGHTRAIL):
        configs = OpusPlanner(b.job.layout, params).phase_configurations(build_program(b.job).stages)
        for perm in configs.values():
            assert is_rail_configuration(perm)


def test_dp_ring_configuration_is_the_ring_of_each_stage_on_every_rail():
    b = built(cluster={"gpus": 256, "gpu": "h100"}, parallel={"tp": 8, "pp": 4, "dp": 8})
    lay = b.job.layout
    perm = OpusPlanner(lay).phase_configurations(build_program(b.job).stages)["dp"]
    assert perm.shape == (8, lay.servers) and is_rail_configuration(perm)
    for rail in range(8):
        for group in lay.groups(Dim.DP):
            servers = lay.server(group)
            assert np.all(lay.rail(group) == lay.rail(group[0]))
            if lay.rail(group[0]) != rail:
                continue
            np.testing.assert_array_equal(perm[rail, servers], np.roll(servers, -1))  # k -> k+1, wrapping


def test_split_pipeline_rails_use_even_rails_forward_and_odd_rails_backward():
    b = JOBS["pp4"]  # PP=4: a middle stage's two neighbours need its ports in turn
    lay = b.job.layout
    plan = OpusPlanner(lay, LIGHTRAIL).plan(build_program(b.job))
    assert plan.phases["pp"] == ("pp",)  # split rails: forward and backward never share a port
    pp = plan.configurations["pp"]
    servers_per_stage = lay.servers // lay.pp
    tx = np.arange(lay.servers)
    forward = (pp >= 0) & (pp // servers_per_stage == tx // servers_per_stage + 1)
    backward = (pp >= 0) & (pp // servers_per_stage == tx // servers_per_stage - 1)
    assert np.all(forward | backward | (pp < 0))
    assert not forward[1::2].any() and forward[0::2].any()
    assert not backward[0::2].any() and backward[1::2].any()
    original = OpusPlanner(lay, ORIGINAL).plan(build_program(b.job))
    assert original.phases["pp"] == ("pp#0", "pp#1")  # without split rails the phase needs two matchings


def test_cross_server_all_to_all_is_split_into_matchings():
    b = JOBS["moe-ep"]
    planner = OpusPlanner(b.job.layout)
    op = next(o for o in build_program(b.job).stages[0] if isinstance(o, CollectiveOp) and o.dim is Dim.EP)
    parts = planner.requirements(op, 0)
    assert len(parts) > 1
    for part in parts:
        rail, tx, rx = part.circuits
        assert len(np.unique(rail * 10**6 + tx)) == len(tx) and len(np.unique(rail * 10**6 + rx)) == len(rx)


def tiny_serial_job():
    """Two one-GPU servers per stage, two stages, one micro-batch: every op is on the critical path."""
    return built(model={"preset": "debug", "overrides": {"layers": 2}},
                 cluster={"gpus": 4, "gpus_per_server": 1, "gpu": "h100"},
                 parallel={"pp": 2, "dp": 2}, job={"micro_batches": 1, "dp_buckets": 1, "megatron_step": False})


def test_exposed_reconfigurations_in_a_serial_job_by_hand():
    # Steady state: the rails hold the DP rings. On demand and checking in per op, the forward send waits one
    # delay (DP -> its circuits), the backward send one (partial reconfiguration installs an op's own circuits,
    # not the rest of its configuration), and stage 0's deferred DP one; stage 1's DP reconfiguration
    # overlaps stage 0's backward. So the iteration grows by exactly 3 delays.
    b = tiny_serial_job()
    params = OpusParams(mode="on_demand", split_pp=False, leases=False)
    base = run(b, delay=0.0, params=params).iteration_time_s
    for d in (1e-3, 2e-3, 7e-3):
        r = run(b, delay=d, params=params)
        assert r.iteration_time_s - base == pytest.approx(3 * d, rel=1e-9)
        assert r.reconfigurations_per_rail == [4]  # fwd, bwd, and each stage's DP ring
    # With leases the stage pair's group is leased whole, both directions lit at its first check-in (the runtime's
    # ``pp:a<->b``): the backward send finds its circuits, one delay and one reconfiguration fewer.
    leased = replace(params, leases=True)
    base = run(b, delay=0.0, params=leased).iteration_time_s
    r = run(b, delay=7e-3, params=leased)
    assert r.iteration_time_s - base == pytest.approx(2 * 7e-3, rel=1e-9) and r.reconfigurations_per_rail == [3]
    # Without deferring DP, stage 1's backward send also waits out the DP ring: one more delay.
    params = replace(params, defer_dp=False)
    base = run(b, delay=0.0, params=params).iteration_time_s
    assert run(b, delay=5e-3, params=params).iteration_time_s - base == pytest.approx(4 * 5e-3, rel=1e-9)


def test_serial_job_on_electrical_rails_sums_its_ops():
    b = tiny_serial_job()
    b = replace(b, fabric=replace(b.fabric, collectives="schedules"))  # the textbook engine's closed forms
    prog = build_program(b.job)
    r = run(b, kind="electrical")
    compute = sum(op.seconds for op in prog.stages[0] if hasattr(op, "seconds")) + \
        sum(op.seconds for op in prog.stages[1] if hasattr(op, "seconds"))
    # PP sends are one step each over GPU -> rail switch -> GPU: alpha + 2 hops + bytes / NIC rate
    act = next(op for op in prog.stages[0] if isinstance(op, SendOp))
    send = b.fabric.alpha + 2 * b.fabric.latency + act.nbytes / b.fabric.nic_bandwidth
    dp_ring = 2 * (b.fabric.alpha + 2 * b.fabric.latency + prog.stages[0][-1].nbytes / 2 / b.fabric.nic_bandwidth)
    assert r.iteration_time_s == pytest.approx(compute + 2 * send + dp_ring, rel=1e-9)


def test_whole_switch_reconfiguration_counts_a_switch_per_phase_change():
    b = JOBS["opus16"]
    b = replace(b, job=replace(b.job, megatron_step=False))  # the buckets overlapping the backward, as derived here
    r = run(b, params=ORIGINAL)
    lightrail = run(b, params=LIGHTRAIL)
    assert min(r.reconfigurations_per_rail) > 0
    assert r.reconfigurations_per_rail == [4] * 4  # fwd pp, dp, bwd pp, dp: a switch per phase change
    assert lightrail.reconfigurations_per_rail == [3] * 4  # the deferred dp is one phase
    # Deferring the gradient buckets costs time here: the four buckets of one communicator run one after
    # another (NCCL's stream), exposed after the last send, where ORIGINAL hides them behind the backward.
    # (lightrail counted them as overlapping for free before, and won by 0.1%; now it loses by 1.3%.)
    no_defer = run(b, params=replace(LIGHTRAIL, defer_dp=False))
    assert no_defer.iteration_time_s < lightrail.iteration_time_s


def test_breakdown_adds_up_and_trace_has_one_track_per_rank_and_ocs():
    b = JOBS["pp4"]
    r = run(b, delay=10e-3, params=ORIGINAL)
    for stage in r.stages:
        parts = stage["compute_s"] + stage["communication_s"] + stage["reconfiguration_s"] + stage["control_s"] \
            + stage["bubble_s"]
        assert parts == pytest.approx(r.iteration_time_s, rel=1e-9) or parts > r.iteration_time_s * 0.999
    trace = chrome_trace(r, b.job.layout)
    json.dumps(trace)  # serialisable
    names = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and "tid" in e}
    assert {(1, rank) for rank in range(b.job.layout.world)} <= names
    assert {(2, rail) for rail in range(8)} <= names
    ocs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 2]
    assert len(ocs) == sum(r.reconfigurations_per_rail)
    assert all(e["dur"] == pytest.approx(10e3) for e in ocs)  # microseconds: the 10 ms delay
    spans = [e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(spans) <= r.iteration_time_s * 1e6 * (1 + 1e-9)


def test_fabric_and_policy_refuse_bad_values():
    from lightrail.errors import ScenarioError

    with pytest.raises(ScenarioError, match="fabric.kind"):
        RailFabric(kind="copper")
    with pytest.raises(ScenarioError, match="reconfig_delay"):
        RailFabric(ocs_delay=-1.0)
    with pytest.raises(ScenarioError, match="ocs.mode"):
        OpusParams(mode="eventually")


@st.composite
def small_jobs(draw):
    g = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4) if d <= g]))
    pp = draw(st.integers(1, 4))
    dp = draw(st.integers(1, 4))
    stage = tp * dp
    assume(stage % g == 0)
    model = {"preset": "debug", "overrides": {"layers": pp * draw(st.integers(1, 2)),
                                              "seq_len": draw(st.sampled_from([256, 4096, 16384]))}}
    return built(model=model, cluster={"gpus": stage * pp, "gpus_per_server": g, "gpu": "h100"},
                 parallel={"tp": tp, "pp": pp, "dp": dp},
                 job={"micro_batches": draw(st.integers(1, 8)), "dp_buckets": draw(st.integers(1, 3))})


@settings(max_examples=25, deadline=None)
@given(job=small_jobs(), policy=st.sampled_from(sorted(POLICIES)))
def test_random_jobs_keep_the_delay_and_mode_properties(job, policy):
    times = {}
    for mode in ("on_demand", "provisioned"):
        params = replace(POLICIES[policy], mode=mode)
        # Delays well above the controller's latencies (0.42 + 0.93 ms): a delay below them can reorder the
        # whole-switch policy's greedy decisions (an anomaly: original, on demand, TP2 x DP4 x PP4 debug job,
        # 15.95 ms at 0 and 15.52 ms at 0.1 ms, in the model before flow sharing too).
        times[mode] = [run(job, delay=d, params=params).iteration_time_s for d in (0.0, 1e-2, 0.1)]
        assert all(a <= b * (1 + 1e-9) for a, b in zip(times[mode], times[mode][1:], strict=False))
        zero = run(job, delay=0.0, params=params, control=(0.0, 0.0)).iteration_time_s
        assert zero == pytest.approx(run(job, kind="ideal", params=params).iteration_time_s, rel=1e-9)
    assert all(p <= o * (1 + 1e-9) for p, o in zip(times["provisioned"], times["on_demand"], strict=True))


def test_fabric_errors_name_the_scenario_fields():
    from lightrail.errors import ScenarioError

    for name, key in (("ocs_delay", "reconfig_delay"), ("check_in_rtt", "check_in_rtt"),
                      ("command_latency", "command_latency")):
        with pytest.raises(ScenarioError) as err:
            RailFabric(**{name: -1.0})
        assert err.value.field == f"ocs.{key}"


def test_fabric_kind_is_an_enum_whose_json_is_the_string():
    fabric = RailFabric(kind="electrical")
    assert fabric.kind is FabricKind.ELECTRICAL and not fabric.circuits
    r = run(JOBS["opus16"], kind="electrical")
    assert type(r.summary()["fabric"]) is str and json.dumps(r.summary()["fabric"]) == '"electrical"'


def test_a_program_collective_runs_the_algorithm_it_names():
    b = JOBS["cp-zero"]  # cp 2 x dp 4: dense gradients sync over groups of 8
    planner = OpusPlanner(b.job.layout)
    span = (Dim.CP, Dim.EP, Dim.DP)
    steps = {algo: sum(len(req.steps) for req in planner.requirements(
        CollectiveOp(Dim.DP, "reducescatter", 1e6, "x", span=span, algorithm=algo), 0))
        for algo in ("auto", "ring", "bruck", "recursive-halving")}
    assert steps == {"auto": 7, "ring": 7, "bruck": 3, "recursive-halving": 3}
    # a whole program on Bruck's schedules runs through the simulator without edits there
    prog = build_program(b.job)
    bruck = replace(prog, stages=tuple(
        tuple(replace(op, algorithm="bruck") if isinstance(op, CollectiveOp) and op.kind != "allreduce" else op
              for op in ops) for ops in prog.stages))
    auto, other = (simulate_iteration(p, b.fabric, replace(LIGHTRAIL, defer_dp=False)) for p in (prog, bruck))
    assert auto.iteration_time_s == run(b, params=replace(LIGHTRAIL, defer_dp=False)).iteration_time_s
    assert other.iteration_time_s > 0 and other.iteration_time_s != auto.iteration_time_s


def test_the_simulation_state_is_set_up_before_it_runs():
    from lightrail.sim.iteration import _Simulation

    b = JOBS["opus16"]
    prog = build_program(b.job, defer_dp=True)
    sim = _Simulation(prog, b.fabric, OpusPlanner(b.job.layout), None)
    names = set(vars(sim))
    first = sim.run_iteration(record=False)
    assert set(vars(sim)) == names and sim.clock == first.end and first.events is None
    second = sim.run_iteration(record=True)
    assert set(vars(sim)) == names and second.start == first.end
    assert sim.result(second).summary() == simulate_iteration(prog, b.fabric).summary()


@pytest.mark.parametrize("job", sorted(JOBS))
def test_requirements_from_compressed_schedules_equal_the_explicit_ones(job, monkeypatch):
    """The planner takes a collective's pairs from its compressed form; with that switched off (explicit
    schedules, step by step) every requirement, plan and iteration time is the same."""
    b = JOBS[job]
    prog = build_program(b.job)
    fast = OpusPlanner(b.job.layout)
    fast_plan = fast.plan(prog)
    import lightrail.control.opus as opus

    monkeypatch.setattr(opus, "compressed_form", lambda *a, **k: None)
    slow = OpusPlanner(b.job.layout)
    slow_plan = slow.plan(prog)
    assert fast._cache.keys() == slow._cache.keys()
    for key, reqs in fast._cache.items():
        other = slow._cache[key]
        assert [r.phase for r in reqs] == [r.phase for r in other]
        for r, o in zip(reqs, other, strict=True):
            assert len(r.steps) == len(o.steps)
            assert all(np.array_equal(a, c) for s, t in zip(r.steps, o.steps, strict=True)
                       for a, c in zip(s, t, strict=True))
            assert all(np.array_equal(a, c) for a, c in zip(r.circuits, o.circuits, strict=True))
    assert fast_plan.configurations.keys() == slow_plan.configurations.keys()
    assert all(np.array_equal(fast_plan.configurations[k], slow_plan.configurations[k])
               for k in fast_plan.configurations)
    monkeypatch.undo()
    fast_time = simulate_iteration(prog, b.fabric, LIGHTRAIL, planner=fast).iteration_time_s
    monkeypatch.setattr(opus, "compressed_form", lambda *a, **k: None)
    assert simulate_iteration(prog, b.fabric, LIGHTRAIL, planner=OpusPlanner(b.job.layout)).iteration_time_s \
        == fast_time
