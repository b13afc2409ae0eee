"""JobRuns simulates each (fabric, policy) once: the ablation's last row and the scenario's own policy, and a delay
sweep's zero-delay counterfactuals, reuse one simulation; so do runs that decide alike (the ideal rail and the
zero-delay one, a run without draining and its twin that never waited to drain): the answer is the one a fresh
simulation gives."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lightrail.control.opus import ORIGINAL
from lightrail.scenario import load_scenario
from lightrail.studies.rails import ABLATION, JobRuns

TINY = Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml"


def test_one_simulation_per_fabric_and_policy_equal_to_a_fresh_one():
    scenario, base = load_scenario(TINY)
    built = scenario.build(base)
    runs = JobRuns(built.job)
    first = runs.run(built.fabric, built.policy)
    assert runs.run(built.fabric, replace(built.policy)) is first  # an equal policy: the same run
    fresh = JobRuns(built.job)(built.fabric, built.policy)
    assert fresh.iteration_time_s == first.iteration_time_s
    assert fresh.summary() == first.summary()
    other = runs.run(replace(built.fabric, ocs_delay=0.0), built.policy)
    assert other is not first  # another fabric: its own simulation


def test_the_ideal_rail_taken_from_the_zero_delay_run_equals_it_simulated():
    scenario, base = load_scenario(TINY)
    built = scenario.build(base)
    for fabric in (built.fabric, replace(built.fabric, switch_grant_latency=1e-3, ocs_delay=0.05)):
        runs = JobRuns(built.job)
        quiet = replace(fabric, check_in_rtt=0.0, command_latency=0.0, revoke_rtt=0.0, ocs_delay=0.0)
        runs.run(quiet, built.policy)  # the breakdown's zero-delay run, as compare_rails runs it first
        ideal = runs.run(replace(fabric, kind="ideal"), built.policy)
        fresh = JobRuns(built.job)(replace(fabric, kind="ideal"), built.policy)
        assert ideal.fabric == "ideal"
        assert ideal.summary() == fresh.summary()
        assert [(e.track, e.name, e.start, e.duration) for e in ideal.events] == \
            [(e.track, e.name, e.start, e.duration) for e in fresh.events]


def test_a_run_without_draining_taken_from_its_twin_that_never_waited_to_drain_equals_it_simulated():
    scenario, base = load_scenario(TINY)
    built = scenario.build(base)
    quiet = replace(built.fabric, check_in_rtt=0.0, command_latency=0.0, revoke_rtt=0.0, ocs_delay=0.0)
    flags = []
    for _, knobs in ABLATION:
        policy = replace(ORIGINAL, mode=built.policy.mode, **knobs)
        for fabric in (quiet, built.fabric):
            runs = JobRuns(built.job)
            drained = runs.run(fabric, policy)
            taken = runs.run(replace(fabric, drain=False), policy)
            fresh = JobRuns(built.job)(replace(fabric, drain=False), policy)
            flags.append(drained.same_without_drain)
            assert (taken is drained) == drained.same_without_drain
            assert taken.summary() == fresh.summary()
            assert [(e.name, e.start, e.duration) for e in taken.events] == \
                [(e.name, e.start, e.duration) for e in fresh.events]
    assert any(flags) and not all(flags)  # the original Opus waits for its rails to drain; lightrail's need not
