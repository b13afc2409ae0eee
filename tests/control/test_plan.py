"""The Plan: phases as parallelism dimensions (unions of circuits, split only where they must be), checked on
hand-built layouts and against brute force; the circuit state shared by the simulator and the emulated OCS;
the control plane in the model."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.control.opus import LIGHTRAIL, ORIGINAL, OpusPlanner
from lightrail.control.plan import is_matching, rail_circuits, runtime_plan, split_into_matchings, union
from lightrail.fabric.circuits import CircuitState, is_partial_permutation
from lightrail.runtime.ocs import EmulatedOCS
from lightrail.scenario import load_scenario, parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.sim.trace import chrome_trace
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.program import CollectiveOp, ComputeOp, SendOp, build_program

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def opus_testbed(**job):
    scenario, base = load_scenario(EXAMPLES / "opus-testbed-llama3-8b-16xa100.yaml")
    built = scenario.build(base)
    return replace(built, job=replace(built.job, **job)) if job else built


# -- phases are dimensions --------------------------------------------------------------------------------


def test_pp2_forward_and_backward_are_one_configuration_on_every_rail():
    """Opus's testbed layout: a stage pair's forward and backward circuits form one matching per rail."""
    lay = Layout.from_degrees(16, tp=4, pp=2, dp=2, gpus_per_server=4)
    # megatron_step off: the phases of the pipeline and the gradient buckets alone (the step adds tp+pp)
    program = build_program(opus_testbed(megatron_step=False).job)
    for plan in (runtime_plan(lay), OpusPlanner(lay, ORIGINAL).plan(program)):
        assert plan.phases == {"pp": ("pp",), "dp": ("dp",)} or plan.phases == {"dp": ("dp",), "pp": ("pp",)}
        pp = plan.configurations["pp"]
        # servers 0,1 hold stage 0 (dp 0, 1), servers 2,3 stage 1: each server talks to its pair both ways
        np.testing.assert_array_equal(pp, np.tile([2, 3, 0, 1], (4, 1)))
        np.testing.assert_array_equal(plan.configurations["dp"], np.tile([1, 0, 3, 2], (4, 1)))


def test_a_middle_stage_of_pp4_splits_the_pipeline_phase_into_forward_and_backward():
    lay = Layout.from_degrees(32, tp=4, pp=4, dp=2, gpus_per_server=4)
    plan = runtime_plan(lay)
    assert plan.phases["pp"] == ("pp#0", "pp#1")
    servers_per_stage = 2
    tx = np.arange(lay.servers)
    for name, step in (("pp#0", +1), ("pp#1", -1)):  # first forward (the traffic needs it first), then backward
        perm = plan.configurations[name]
        lit = perm >= 0
        assert np.all(perm[lit] // servers_per_stage == np.broadcast_to(tx, perm.shape)[lit] // servers_per_stage
                      + step)
        assert lit.sum() == 4 * 3 * servers_per_stage  # every rail, every stage boundary, both dp replicas
    assert not plan.single_configuration("pp") and plan.single_configuration("dp")


def test_the_published_policy_no_longer_reconfigures_per_micro_batch_on_the_testbed():
    """2m+1 switches per iteration came from naming forward and backward as two phases; as Opus defines
    phases there is one PP configuration, so a rail changes only between the PP and DP phases (the gradient buckets
    overlapping the backward, without Megatron's step after it)."""
    b = opus_testbed(megatron_step=False)
    for mode in ("on_demand", "provisioned"):
        r = simulate_iteration(build_program(b.job), b.fabric, replace(ORIGINAL, mode=mode))
        assert r.reconfigurations_per_rail == [4] * 4  # (pp -> dp, dp -> pp) per stage... on every rail
        assert r.reconfigurations_per_iteration < 2 * b.job.micro_batches + 1


def _brute_force_fewest(layout, reqs) -> int:
    n = len(reqs)
    for k in range(1, n + 1):
        for colours in itertools.product(range(k), repeat=n):
            if len(set(colours)) < k:
                continue
            if all(is_matching(layout, union(layout, *(r for r, c in zip(reqs, colours, strict=True) if c == i)))
                   for i in range(k)):
                return k
    return n


@pytest.mark.parametrize(("pp", "dp"), [(2, 1), (2, 2), (3, 2), (4, 1), (4, 2), (5, 1)])
def test_first_fit_splits_the_pipeline_into_the_fewest_matchings(pp, dp):
    lay = Layout.from_degrees(4 * pp * dp, tp=4, pp=pp, dp=dp, gpus_per_server=4)
    stride = lay.stride(Dim.PP)
    reqs = []
    for s in range(pp):
        r = lay.stage_ranks(s)
        if s < pp - 1:
            reqs.append(rail_circuits(lay, r, r + stride))
        if s > 0:
            reqs.append(rail_circuits(lay, r, r - stride))
    colour, configs = split_into_matchings(lay, reqs)
    assert all(is_matching(lay, c) for c in configs)
    assert len(configs) == _brute_force_fewest(lay, reqs) == (1 if pp <= 2 else 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4), st.integers(0, 4)), min_size=1,
                         max_size=3), min_size=1, max_size=5))
def test_first_fit_matchings_are_valid_and_never_split_a_matching(raw):
    lay = Layout.from_degrees(10, tp=1, dp=10, gpus_per_server=2)  # 5 servers, 2 rails
    reqs = []
    for circuits in raw:
        rail, tx, rx = (np.array(x) for x in zip(*circuits, strict=True))
        keep = tx != rx
        req = union(lay, (rail[keep], tx[keep], rx[keep]))
        if len(req[0]) and is_matching(lay, req):  # a requirement is one matching (one op part)
            reqs.append(req)
    if not reqs:
        return
    colour, configs = split_into_matchings(lay, reqs)
    assert all(is_matching(lay, c) for c in configs)
    for req, c in zip(reqs, colour, strict=True):  # each requirement lies whole inside its configuration
        assert set(zip(*req, strict=True)) <= set(zip(*configs[c], strict=True))
    if is_matching(lay, union(lay, *reqs)):
        assert len(configs) == 1
    assert len(configs) >= _brute_force_fewest(lay, reqs) if len(reqs) <= 4 else True


def test_runtime_plans_of_small_layouts_are_valid_and_plan_every_dimension():
    """Over every small layout: each configuration is a partial permutation on every rail, no dimension
    is left out, and the pipeline is one configuration exactly when PP <= 2 (rings of groups that share a
    server, e.g. cp=3 on 2-GPU servers, can need two)."""
    count = 0
    for g, tp, cp, dp, pp in itertools.product((2, 4, 8), (1, 2, 4), (1, 2, 3), (1, 2, 3, 4, 6), (1, 2, 3, 4)):
        try:
            lay = Layout.from_degrees(tp * cp * dp * pp, tp=tp, cp=cp, dp=dp, pp=pp, gpus_per_server=g)
        except Exception:  # noqa: BLE001 (layouts that do not fit servers)
            continue
        plan = runtime_plan(lay)
        count += 1
        assert plan.notes["unplanned"] == []
        for name, perm in plan.configurations.items():
            assert all(is_partial_permutation(row) for row in perm), (lay, name)
        if pp > 1 and lay.servers >= pp:
            assert plan.single_configuration("pp") == (pp <= 2)
    assert count > 50


def test_a_requirement_that_is_not_a_matching_is_refused():
    from lightrail.errors import InfeasibleError

    lay = Layout.from_degrees(8, tp=1, dp=8, gpus_per_server=2)
    two_from_one_port = (np.array([0, 0]), np.array([1, 1]), np.array([2, 3]))
    with pytest.raises(InfeasibleError, match="two circuits on one port"):
        split_into_matchings(lay, [two_from_one_port])


# -- one circuit model --------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 5), st.integers(0, 5), max_size=4), min_size=1, max_size=6))
def test_the_emulated_ocs_and_circuit_state_agree_on_every_change(changes):
    """The emulated OCS keeps its configuration in the simulator's CircuitState: after any sequence of
    valid changes, apply() reports the lit time of the ports the change darkened, and partial
    reconfiguration through CircuitState.apply lights the same circuits."""
    ocs = EmulatedOCS(ports=6, delay_s=0.01)
    mirror = CircuitState(1, 6, 0.01)
    now = 0.0
    for change in changes:
        change = {i: o for i, o in change.items() if i != o}
        try:
            after = ocs.validate(change)
        except Exception:  # noqa: BLE001 (invalid changes are refused and change nothing)
            continue
        before = ocs.state()
        lit = ocs.apply(change, now)
        new = {i: o for i, o in after.items() if before.get(i) != o}
        mirror.apply(np.zeros(len(new), int), list(new), list(new.values()), now)
        for i in [i for i, o in change.items() if o is None and i in before]:
            mirror.tx_target[0, i] = -1
            mirror.rx_source[0, before[i]] = -1
        assert ocs.state() == {i: int(o) for i, o in enumerate(mirror.tx_target[0]) if o >= 0}
        assert lit == (now + 0.01 if before != after else now)
        now += 1.0


# -- the control plane in the model --------------------------------------------------------------------------


def test_provisioned_learns_at_the_release_and_pays_the_controller_before_switching():
    """A serial job: on demand, each reconfiguration costs rtt/2 + command + delay + rtt/2 on top of the op;
    provisioned knows the next phase only at the previous phase's release, so with no compute between two
    phases it saves nothing, and it never loses."""
    b = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 2}},
                        "cluster": {"gpus": 4, "gpus_per_server": 1, "gpu": "h100"},
                        "parallel": {"pp": 2, "dp": 2},
                        "job": {"micro_batches": 1, "dp_buckets": 1, "megatron_step": False}}).build()
    prog = build_program(b.job, defer_dp=True)
    params = replace(LIGHTRAIL, split_pp=False, leases=False, mode="on_demand")
    delay, rtt, cmd = 5e-3, 1e-3, 2e-3

    def time(rtt_, cmd_, mode="on_demand"):
        fabric = replace(b.fabric, ocs_delay=delay, check_in_rtt=rtt_, command_latency=cmd_)
        return simulate_iteration(prog, fabric, replace(params, mode=mode))

    quiet = time(0.0, 0.0)
    loud = time(rtt, cmd)
    # the critical path checks in three times (the forward send, the backward send, stage 0's DP ring; stage
    # 1's DP overlaps stage 0's backward), each needing a reconfiguration (tests/test_opus.py derives them):
    # request rtt/2, command, the delay (already in `quiet`), grant rtt/2
    extra = loud.iteration_time_s - quiet.iteration_time_s
    assert extra == pytest.approx(3 * (rtt + cmd), rel=1e-9)
    # per rank: one send, its receive (the pair's group checks in both ranks, the runtime's barrier), one DP ring
    assert loud.controller_round_trips_per_iteration == 3
    assert loud.controller_requests_per_iteration == 6  # without leases each check-in is an acquire and a release
    assert time(rtt, cmd, "provisioned").iteration_time_s <= loud.iteration_time_s * (1 + 1e-12)


def test_trace_shows_control_round_trips_as_their_own_slices():
    b = opus_testbed()
    r = simulate_iteration(build_program(b.job), b.fabric, ORIGINAL)
    trace = chrome_trace(r, b.job.layout)
    control = [e for e in trace["traceEvents"] if e.get("cat") == "control"]
    assert control and all(e["dur"] == pytest.approx(b.fabric.check_in_rtt * 1e6) for e in control
                           if e["dur"] < b.fabric.check_in_rtt * 1e6 * 1.0001)
    json.dumps(trace)


def test_leases_cut_round_trips_to_phase_changes():
    b = opus_testbed(megatron_step=False)  # two phases, pp and dp (the step adds tp+pp)
    prog = build_program(b.job, defer_dp=True)
    per_op = simulate_iteration(prog, b.fabric, replace(LIGHTRAIL, leases=False))
    leased = simulate_iteration(prog, b.fabric, LIGHTRAIL)
    sends = sum(1 for op in prog.stages[0] if isinstance(op, SendOp))
    assert per_op.controller_round_trips_per_iteration >= sends  # Opus: every op checks in
    # one lease per phase (pp, dp) per rank; the last stage also checks in for its first backward send: its
    # forward receive's lease held the forward circuits, and split pipeline rails put the backward on other rails
    assert [st["round_trips"] for st in leased.stages] == [2, 3]
    assert leased.iteration_time_s <= per_op.iteration_time_s


def test_sweep_rows_keep_the_contract(tmp_path):
    from typer.testing import CliRunner

    from lightrail.cli import app

    result = CliRunner().invoke(app, ["sweep", str(EXAMPLES / "opus-testbed-llama3-8b-16xa100.yaml"), "--ocs-delays",
                                      "0,100ms", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["routing"] == "pxn"
    assert {(r["policy"], r["mode"]) for r in out["rows"]} == {(p, m) for p in ("opus", "lightrail")
                                                               for m in ("on-demand", "provisioned")}
    base = out["baseline_iteration_time_s"]
    for r in out["rows"]:
        assert {"delay_s", "mode", "policy", "overhead", "reconfigurations_per_iteration"} <= set(r)
        assert sum(r["overhead_breakdown_s"].values()) == pytest.approx(r["iteration_time_s"] - base, abs=1e-12)
        if r["delay_s"] == 0:
            assert r["overhead_breakdown_s"]["switching_delay_s"] == 0


def test_on_demand_is_accepted_with_a_hyphen_in_scenarios():
    b = parse_scenario({"name": "t", "model": "debug", "cluster": {"gpus": 8},
                        "job": {"micro_batches": 1}, "ocs": {"mode": "on-demand"}}).build()
    assert b.params.mode == "on-demand"


def test_gpipe_runs_every_forward_then_every_backward_in_reverse():
    b = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 2}},
                        "cluster": {"gpus": 4, "gpus_per_server": 1, "gpu": "h100"}, "parallel": {"pp": 2, "dp": 2},
                        "job": {"micro_batches": 3, "dp_buckets": 1, "schedule": "gpipe"}}).build()
    prog = build_program(b.job)
    for ops in prog.stages:
        labels = [op.label for op in ops if isinstance(op, ComputeOp)]
        assert labels == ["F0", "F1", "F2", "B2", "B1", "B0"]
        last_compute = max(i for i, op in enumerate(ops) if isinstance(op, ComputeOp))
        # the gradient sync comes after B0
        assert any(isinstance(op, CollectiveOp) and op.dim is Dim.DP for op in ops[last_compute:])


def test_a_bad_schedule_or_routing_names_its_field(tmp_path):
    from typer.testing import CliRunner

    from lightrail.cli import app

    for section, value, fld in (("job", {"micro_batches": 1, "schedule": "zigzag"}, "job.schedule"),
                                ("cluster", {"gpus": 8, "routing": "spray"}, "cluster.routing")):
        scenario = {"name": "t", "model": "debug", "cluster": {"gpus": 8}, "job": {"micro_batches": 1}}
        scenario[section] = value
        path = tmp_path / "s.json"
        path.write_text(json.dumps(scenario))
        result = CliRunner().invoke(app, ["simulate", str(path), "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and fld in result.output
        assert not (tmp_path / "out").exists()


def test_sweep_table_shows_where_the_overhead_goes(tmp_path):
    from typer.testing import CliRunner

    from lightrail.cli import app

    result = CliRunner().invoke(app, ["sweep", str(EXAMPLES / "opus-testbed-llama3-8b-16xa100.yaml"), "--ocs-delays",
                                      "10ms", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for text in ("where the overhead goes", "switching", "drain wait", "control", "lost overlap", "PXN"):
        assert text in result.output
