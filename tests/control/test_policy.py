"""One policy object: ``control.plan.Policy`` is the only declaration of the OCS policy; the scenario's ``ocs``
section takes its fields from it, the Plan carries it, and the simulator and the torch backend read it there."""

from __future__ import annotations

import ast
import pickle
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from lightrail.control.opus import LIGHTRAIL, ORIGINAL, OpusParams, OpusPlanner
from lightrail.control.plan import Mode, Plan, Policy, rail_circuits, runtime_plan
from lightrail.errors import ScenarioError
from lightrail.scenario import OcsSection, parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.program import build_program

SRC = Path(__file__).resolve().parents[2] / "src" / "lightrail"
POLICY_NAMES = {f.name for f in fields(Policy)} | {"whole_switch"}


def _declarations(path: Path):
    """(class, name) of every policy-named field a class in ``path`` declares: annotated class attributes, and
    keywords of a ``create_model`` call (pydantic's dynamic fields)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id in POLICY_NAMES:
                    yield node.name, st.target.id
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "create_model":
            for kw in node.keywords:
                if kw.arg in POLICY_NAMES:
                    yield "create_model", kw.arg


def test_the_policy_is_declared_once_in_scenario_control_and_runtime():
    files = [SRC / "scenario.py", *SRC.glob("control/**/*.py"), *SRC.glob("runtime/**/*.py")]
    found = {(str(p.relative_to(SRC)), cls, name) for p in files for cls, name in _declarations(p)}
    assert found == {("control/plan.py", "Policy", f.name) for f in fields(Policy)}
    assert OpusParams is Policy  # the old name reads the same object


def test_the_ocs_section_takes_its_policy_fields_from_policy():
    section = OcsSection.model_fields
    for f in fields(Policy):
        assert section[f.name].description == f.metadata["doc"]
        assert section[f.name].default == (f.default.value if f.name == "mode" else f.default)
    assert OcsSection().policy() == LIGHTRAIL
    given = {"mode": "on_demand", "partial": False, "skip_present": False, "split_pp": False, "defer_dp": False,
             "leases": False}
    assert OcsSection(**given).policy() == replace(ORIGINAL, mode=Mode.ON_DEMAND)


@pytest.mark.parametrize(("ocs", "field"), [({"leases": "maybe"}, "ocs.leases"), ({"mode": "later"}, "ocs.mode")])
def test_a_bad_policy_value_names_its_ocs_field(ocs, field):
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"name": "t", "model": "debug", "cluster": {"gpus": 8}, "job": {"micro_batches": 2},
                        "ocs": ocs})
    assert info.value.field == field


def test_policy_reads_the_mode_once_and_checks_its_knobs():
    assert Policy(mode="on_demand").mode is Mode.ON_DEMAND and Policy(partial=False).whole_switch
    with pytest.raises(ScenarioError) as info:
        Policy(leases=1)
    assert info.value.field == "ocs.leases"


def _built(**ocs):
    return parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 4}},
                           "cluster": {"gpus": 16, "gpus_per_server": 2},
                           "parallel": {"tp": 2, "pp": 2, "dp": 4}, "job": {"micro_batches": 4},
                           "ocs": {"reconfig_delay": "5ms", **ocs}}).build()


def test_the_simulator_executes_the_policy_of_the_plan_it_is_given():
    built = _built()
    program = build_program(built.job, defer_dp=True)
    plans = {leases: OpusPlanner(built.job.layout, replace(built.policy, leases=leases)).plan(program)
             for leases in (True, False)}
    assert all(plan.policy.leases is leases for leases, plan in plans.items())
    by_plan = {k: simulate_iteration(program, built.fabric, plan) for k, plan in plans.items()}
    by_policy = {k: simulate_iteration(program, built.fabric, plan.policy) for k, plan in plans.items()}
    for k in plans:
        assert by_plan[k].iteration_time_s == by_policy[k].iteration_time_s
        assert by_plan[k].plan is plans[k]
    assert by_plan[False].controller_round_trips_per_iteration > by_plan[True].controller_round_trips_per_iteration


def test_the_simulator_refuses_another_programs_plan():
    built = _built()
    other = _built(split_pp=False)
    program = build_program(built.job, defer_dp=True)
    plan = OpusPlanner(other.job.layout, other.policy).plan(build_program(other.job, defer_dp=True))
    with pytest.raises(ValueError, match="not this program's"):
        simulate_iteration(program, built.fabric, replace(plan, policy=built.policy))


def test_a_plan_serves_the_circuits_of_its_single_configuration_phases_only():
    lay = Layout.from_degrees(16, tp=1, pp=4, dp=4, gpus_per_server=2)
    plan = runtime_plan(lay, Policy(mode="on-demand"))
    assert plan.mode is Mode.ON_DEMAND and plan.leases and not plan.whole_switch
    group = lay.groups(Dim.DP)[0]
    ring = rail_circuits(lay, group, np.roll(group, -1))
    assert plan.serves("dp", ring)
    bad = (ring[0], ring[1], (ring[2] + 1) % lay.servers)  # a circuit the dp configuration does not hold
    assert not plan.serves("dp", bad)
    assert not plan.single_configuration("pp") and not plan.serves("pp", rail_circuits(lay, [4], [8]))
    copy = pickle.loads(pickle.dumps(plan))  # the backend's config carries it to spawned workers
    assert copy.policy == plan.policy and all(np.array_equal(copy.configurations[k], v)
                                              for k, v in plan.configurations.items())
    assert isinstance(copy, Plan)
