"""A whole-switch run without ``skip_present`` knows whether it ever rewrote a rail that already held its op's
circuits (the one decision ``skip_present`` changes): when it never did, the run with ``skip_present`` is the same
run, and ``JobRuns`` takes it instead of simulating again; when it did, the flag says so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lightrail.control.opus import ORIGINAL, Requirement
from lightrail.control.plan import Mode, Plan
from lightrail.fabric.params import RailFabric
from lightrail.scenario import load_scenario
from lightrail.sim.rails import Rails
from lightrail.studies.rails import JobRuns
from lightrail.workload.parallel import Layout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _without_label(result):
    return {**result.summary(), "policy": None}


@pytest.mark.parametrize("mode", [Mode.ON_DEMAND, Mode.PROVISIONED])
@pytest.mark.parametrize("knobs", [{}, {"split_pp": True}, {"defer_dp": True, "leases": True}])
def test_the_twins_run_taken_equals_the_run_simulated(mode, knobs):
    scenario, base = load_scenario(EXAMPLES / "debug-tiny.yaml")
    built = scenario.build(base)
    policy = replace(ORIGINAL, mode=mode, **knobs)
    for fabric in (built.fabric, replace(built.fabric, check_in_rtt=0.0, command_latency=0.0, ocs_delay=0.0)):
        runs = JobRuns(built.job)
        twin = runs.run(fabric, policy)
        taken = runs.run(fabric, replace(policy, skip_present=True))
        fresh = JobRuns(built.job)(fabric, replace(policy, skip_present=True))
        assert twin.same_with_skip_present  # these programs never rewrite a rail holding the op's circuits
        assert taken.policy == fresh.policy and taken.plan.policy == fresh.plan.policy
        assert _without_label(taken) == _without_label(fresh)
        assert [(e.track, e.name, e.start, e.duration) for e in taken.events] == \
            [(e.track, e.name, e.start, e.duration) for e in fresh.events]


def _rails(skip_present: bool) -> tuple[Rails, Requirement, Requirement]:
    """One rail of four servers: phase ``a`` a ring, phase ``c`` a pair whose circuit 0 -> 1 the ring has too."""
    layout = Layout(tp=1, cp=1, ep=1, dp=4, pp=1, gpus_per_server=1)
    ring, pair = np.array([[1, 2, 3, 0]]), np.array([[1, 0, -1, -1]])
    policy = replace(ORIGINAL, skip_present=skip_present)
    plan = Plan(layout, {"a": ring, "c": pair}, {"a": ("a",), "c": ("c",)}, policy)
    fabric = RailFabric(ocs_delay=0.01, check_in_rtt=0.0, command_latency=0.0, revoke_rtt=0.0)
    one = np.zeros(1, np.int64)
    a = Requirement("a", (), (np.zeros(4, np.int64), np.arange(4), np.array([1, 2, 3, 0])))
    c = Requirement("c", (), (one, one, one + 1))
    return Rails(plan, fabric, layout), a, c


def test_a_rewrite_skip_present_would_skip_is_flagged():
    rails, a, c = _rails(skip_present=False)
    rails.ensure(a, 0.0)
    assert not rails.skip_matters and len(rails.reconfigs) == 1
    rails.ensure(c, 1.0)  # 0 -> 1 is there, but the rail holds a: Opus rewrites it to c
    assert rails.skip_matters and len(rails.reconfigs) == 2
    skipping, a, c = _rails(skip_present=True)
    skipping.ensure(a, 0.0)
    skipping.ensure(c, 1.0)
    assert len(skipping.reconfigs) == 1  # the other policy: a different run
