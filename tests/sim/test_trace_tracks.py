"""Perfetto tracks: no two slices on one track overlap without nesting, in the iteration's trace and the replay's."""

from __future__ import annotations

import pytest

from lightrail.scenario import DEFAULT_SCENARIO, parse_scenario
from lightrail.sim.iteration import TraceEvent, simulate_iteration
from lightrail.sim.trace import chrome_trace, lanes, misdrawn
from lightrail.workload.program import build_program


def test_lanes_partition_overlaps_into_as_few_lanes_as_the_deepest_overlap():
    ev = [TraceEvent("t", str(i), "c", s, d) for i, (s, d) in enumerate([(0, 4), (1, 1), (1.5, 3), (2, 1), (5, 1)])]
    got = lanes(ev)
    assert max(got) + 1 == 3  # at 2.0: events 0, 2 and 3 are in flight
    for a in range(len(ev)):
        for b in range(a):
            if got[a] == got[b]:
                assert ev[a].start >= ev[b].start + ev[b].duration or ev[b].start >= ev[a].start + ev[a].duration


@pytest.mark.parametrize("policy", ["lightrail", "original"])
def test_the_default_scenarios_trace_draws_every_slice_on_a_track_of_its_own(policy):
    from lightrail.control.opus import LIGHTRAIL, ORIGINAL

    params = {"lightrail": LIGHTRAIL, "original": ORIGINAL}[policy]
    built = parse_scenario({**DEFAULT_SCENARIO, "parallel": {"tp": 8, "pp": 4, "dp": 2},
                            "cluster": {**DEFAULT_SCENARIO["cluster"], "gpus": 64},
                            "job": {**DEFAULT_SCENARIO["job"], "overlap_grad_reduce": True}}).build()
    result = simulate_iteration(build_program(built.job, defer_dp=params.defer_dp), built.fabric, params)
    trace = chrome_trace(result, built.job.layout)
    assert misdrawn(trace) == []
    # the gradient buckets overlap the backward: they are on their own threads, named after their rank
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("async" in n for n in names)
