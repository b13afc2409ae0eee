"""Flow-level sharing: max-min fair rates on hand-derived link graphs, the timeline of flows that start and end,
and a Chakra trace's concurrent collectives contending (the issue's contract)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.sharing import FairShare, OpCost, fair_rates


def rates(rows, nflows):
    flow, link, use = (np.array(c, dtype=float if k == 2 else np.int64) for k, c in enumerate(zip(*rows, strict=True)))
    return fair_rates(flow, link, use, nflows)


def test_two_flows_on_one_link_get_half_each():
    assert rates([(0, 0, 1.0), (1, 0, 1.0)], 2).tolist() == [0.5, 0.5]


def test_a_flow_limited_elsewhere_leaves_the_rest_to_the_other():
    # link 1 carries A, C, D: a third each; A is frozen there, so B takes the two thirds of link 0 A leaves
    got = rates([(0, 0, 1.0), (0, 1, 1.0), (1, 0, 1.0), (2, 1, 1.0), (3, 1, 1.0)], 4)
    assert got == pytest.approx([1 / 3, 2 / 3, 1 / 3, 1 / 3])


def test_a_flow_that_needs_little_runs_as_fast_as_alone():
    # B needs a quarter of the link at its own pace: it keeps that, A gets the other three quarters
    assert rates([(0, 0, 1.0), (1, 0, 0.25)], 2) == pytest.approx([0.75, 1.0])


def test_latency_bound_ops_do_not_slow_each_other():
    assert rates([(0, 0, 0.3), (1, 0, 0.3), (2, 0, 0.3)], 3).tolist() == [1.0, 1.0, 1.0]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 4), st.floats(0.05, 1.0)),
                         min_size=n, max_size=20))))
def test_rates_are_feasible_and_every_slowed_flow_has_a_bottleneck(case):
    n, rows = case
    rows = rows + [(f, 5 + f, 0.01) for f in range(n)]  # every flow has a row
    flow = np.array([r[0] for r in rows])
    link = np.array([r[1] for r in rows])
    use = np.array([r[2] for r in rows])
    # one row per (flow, link): merge duplicates as the engine's busy seconds would
    key = flow * 100 + link
    uniq, inv = np.unique(key, return_inverse=True)
    flow, link, use = uniq // 100, uniq % 100, np.minimum(np.bincount(inv, weights=use), 1.0)
    _, link = np.unique(link, return_inverse=True)
    r = fair_rates(flow, link, use, n)
    assert np.all(r > 0) and np.all(r <= 1 + 1e-12)
    load = np.bincount(link, weights=r[flow] * use)
    assert np.all(load <= 1 + 1e-9)  # feasible
    peak = np.zeros(n)
    np.maximum.at(peak, flow, use)
    share = r * peak
    for f in range(n):
        if r[f] < 1 - 1e-9:  # max-min: slowed only on a full link where nobody gets a larger share
            mine = link[flow == f]
            assert any(load[e] > 1 - 1e-9 and share[f] >= share[flow[link == e]].max() - 1e-9 for e in mine)


def one_link(seconds, busy=None):
    return OpCost(seconds, np.array([0]), np.array([seconds if busy is None else busy]))


def drain(share):
    """Finish every flow in order: (time, key) pairs."""
    out = []
    while (nxt := share.next_finish()) is not None:
        share.finish(nxt[1], nxt[0])
        out.append(nxt)
    return out


def test_a_flow_that_starts_midway_slows_the_first_then_runs_alone():
    share = FairShare()
    share.start("a", one_link(1.0), 0.0)
    share.start("b", one_link(1.0), 0.5)  # a has 0.5 s of work left, now at half rate: it ends at 1.5
    first = share.next_finish()
    assert first == (pytest.approx(1.5), "a")
    share.finish("a", first[0])
    assert share.next_finish() == (pytest.approx(2.0), "b")  # b did 0.5 s of work by 1.5, then alone


def test_without_sharing_each_flow_runs_alone():
    share = FairShare(fair=False)
    share.start("a", one_link(1.0), 0.0)
    share.start("b", one_link(1.0), 0.0)
    assert drain(share) == [(1.0, "a"), (1.0, "b")]


def test_flows_on_other_links_keep_their_rate():
    share = FairShare()
    share.start("a", one_link(1.0), 0.0)
    share.start("b", OpCost(1.0, np.array([1]), np.array([1.0])), 0.0)
    assert [t for t, _ in drain(share)] == [1.0, 1.0]


# -- a Chakra trace's concurrent collectives (the contract) ---------------------------------------------------
chakra = pytest.importorskip("chakra")
from chakra.schema.protobuf.et_def_pb2 import ALL_REDUCE, COMM_COLL_NODE, GlobalMetadata  # noqa: E402
from chakra.schema.protobuf.et_def_pb2 import AttributeProto as Attr  # noqa: E402
from chakra.schema.protobuf.et_def_pb2 import Node as ChakraNode  # noqa: E402
from chakra.src.third_party.utils.protolib import encodeMessage as encode_message  # noqa: E402

MiB = 2**20


def allreduce(i, nbytes, pg):
    n = ChakraNode(id=i, name=f"AR{i}", type=COMM_COLL_NODE)
    n.attr.extend([Attr(name="comm_type", int64_val=ALL_REDUCE), Attr(name="comm_size", int64_val=int(nbytes)),
                   Attr(name="pg_name", string_val=pg)])
    return n


def trace_scenario(tmp_path, per_rank, groups, *, gpus_per_server=8, sharing=None):
    folder = tmp_path / "trace"
    folder.mkdir(parents=True)
    for rank, nodes in enumerate(per_rank):
        with open(folder / f"workload.{rank}.et", "wb") as f:
            encode_message(f, GlobalMetadata(version="0.0.4"))
            for node in nodes:
                encode_message(f, node)
    (folder / "workload.json").write_text(json.dumps(groups))
    scenario = {"name": "two", "workload": {"chakra": "trace"},
                "cluster": {"gpus": len(per_rank), "gpus_per_server": gpus_per_server, "gpu": "h100"}}
    if sharing:
        scenario["engine"] = {"sharing": sharing}
    path = tmp_path / "two.json"
    path.write_text(json.dumps(scenario))
    return path


def simulate(path):
    from lightrail.scenario import load_scenario
    from lightrail.studies.replay import simulate_trace

    scenario, base = load_scenario(path)
    return simulate_trace(scenario.build(base)).result.iteration_time_s


@pytest.mark.parametrize("same_communicator", [True, False])
def test_two_independent_allreduces_on_the_same_gpus_take_twice_one(tmp_path, same_communicator):
    one = simulate(trace_scenario(tmp_path / "one", [[allreduce(1, 256 * MiB, "0")] for _ in range(8)],
                                  {"0": list(range(8))}))
    pgs = ("0", "0") if same_communicator else ("0", "1")
    two = simulate(trace_scenario(tmp_path / "two", [[allreduce(1, 256 * MiB, pgs[0]), allreduce(2, 256 * MiB, pgs[1])]
                                                     for _ in range(8)], {"0": list(range(8)), "1": list(range(8))}))
    assert two >= 1.9 * one
    if same_communicator:  # one stream: one after the other
        assert two == pytest.approx(2 * one, rel=1e-9)
    else:  # both move their bytes at half rate, then each pays its latency: latency + 2 x bytes < 2 x one
        assert two < 2 * one


def test_two_allreduces_on_disjoint_gpus_of_one_nvswitch_take_one(tmp_path):
    one = simulate(trace_scenario(tmp_path / "one", [[allreduce(1, 256 * MiB, "0")] if r < 4 else []
                                                     for r in range(8)], {"0": [0, 1, 2, 3]}))
    two = simulate(trace_scenario(tmp_path / "two", [[allreduce(1, 256 * MiB, "0" if r < 4 else "1")]
                                                     for r in range(8)], {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}))
    assert two == pytest.approx(one, rel=1e-9)


def test_sharing_none_keeps_the_old_answer(tmp_path):
    per_rank = [[allreduce(1, 256 * MiB, "0"), allreduce(2, 256 * MiB, "1")] for _ in range(8)]
    groups = {"0": list(range(8)), "1": list(range(8))}
    one = simulate(trace_scenario(tmp_path / "one", [[allreduce(1, 256 * MiB, "0")] for _ in range(8)],
                                  {"0": list(range(8))}))
    alone = simulate(trace_scenario(tmp_path / "none", per_rank, groups, sharing="none"))
    assert alone == pytest.approx(one, rel=1e-12)  # two communicators, each timed as if alone


def test_the_replays_trace_draws_overlapping_collectives_on_tracks_of_their_own(tmp_path):
    from lightrail.report.replay import chrome_trace_of_replay
    from lightrail.scenario import load_scenario
    from lightrail.sim.trace import misdrawn
    from lightrail.studies.replay import simulate_trace

    path = trace_scenario(tmp_path, [[allreduce(1, 256 * MiB, "0"), allreduce(2, 256 * MiB, "1")] for _ in range(8)],
                          {"0": list(range(8)), "1": list(range(8))})
    scenario, base = load_scenario(path)
    run = simulate_trace(scenario.build(base))
    trace = chrome_trace_of_replay(run)
    assert misdrawn(trace) == []
    comm = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "allreduce"}
    assert len(comm) == 16  # two overlapping collectives on each of 8 ranks: two threads per rank


# -- the iteration simulator: one communicator's ops in issue order, two communicators share ------------------
def two_async_allreduces(same_communicator: bool, sharing: str = "fair"):
    from lightrail.control.opus import LIGHTRAIL
    from lightrail.fabric.params import RailFabric
    from lightrail.scenario import parse_scenario
    from lightrail.sim.iteration import simulate_iteration
    from lightrail.workload.parallel import Dim
    from lightrail.workload.program import CollectiveOp, Program

    built = parse_scenario({"name": "t", "model": "debug", "cluster": {"gpus": 8, "gpus_per_server": 1, "gpu": "h100"},
                            "parallel": {"dp": 8}, "job": {"micro_batches": 1}}).build()
    spans = ((Dim.DP,), (Dim.DP,)) if same_communicator else ((Dim.DP,), (Dim.CP, Dim.DP))  # cp = 1: same ranks
    ops = tuple(CollectiveOp(Dim.DP, "allreduce", 256 * MiB, f"bucket {k}", asynchronous=True, span=span,
                             algorithm="ring") for k, span in enumerate(spans))
    fabric = RailFabric(kind="electrical", sharing=sharing, collectives="schedules")
    one = simulate_iteration(Program(built.job, (ops[:1],)), fabric, LIGHTRAIL).iteration_time_s
    two = simulate_iteration(Program(built.job, (ops,)), fabric, LIGHTRAIL).iteration_time_s
    return one, two


def test_a_communicators_ops_run_one_after_another_in_the_iteration():
    one, two = two_async_allreduces(same_communicator=True)
    assert two == pytest.approx(2 * one, rel=1e-12)
    assert two_async_allreduces(same_communicator=True, sharing="none")[1] == pytest.approx(2 * one, rel=1e-12)


def test_two_communicators_on_the_same_ranks_share_their_links_in_the_iteration():
    # ring allreduce of N on p = 8 GPUs behind one rail switch: 2(p-1) steps of alpha + 2 hops, and 2(p-1)/p N/B
    from lightrail.fabric.params import RailFabric

    f = RailFabric(kind="electrical")
    latency = 14 * (f.alpha + 2 * f.latency)
    wire = 14 / 8 * 256 * MiB / f.nic_bandwidth
    one, two = two_async_allreduces(same_communicator=False)
    assert one == pytest.approx(latency + wire, rel=1e-9)
    assert two == pytest.approx(latency + 2 * wire, rel=1e-9)  # bytes at half rate each, then each one's latency
    assert two_async_allreduces(same_communicator=False, sharing="none")[1] == pytest.approx(one, rel=1e-12)


def test_a_collective_over_the_pipeline_starts_when_its_last_stage_arrives():
    from lightrail.control.opus import LIGHTRAIL
    from lightrail.fabric.params import RailFabric
    from lightrail.scenario import parse_scenario
    from lightrail.sim.iteration import simulate_iteration
    from lightrail.workload.parallel import Dim
    from lightrail.workload.program import CollectiveOp, ComputeOp, Program

    built = parse_scenario({"name": "t", "model": "debug", "cluster": {"gpus": 2, "gpus_per_server": 1, "gpu": "h100"},
                            "parallel": {"pp": 2}, "job": {"micro_batches": 1}}).build()
    norm = CollectiveOp(Dim.PP, "allreduce", 4, "get_grad_norm_fp32", span=(Dim.TP, Dim.PP), algorithm="ring")
    after = ComputeOp(0.5, "step")
    fabric = RailFabric(kind="electrical", collectives="schedules")
    alone = simulate_iteration(Program(built.job, ((norm,), (norm,))), fabric, LIGHTRAIL)
    late = simulate_iteration(Program(built.job, ((ComputeOp(1.0, "backward"), norm, after), (norm, after))), fabric,
                              LIGHTRAIL)
    op = alone.iteration_time_s
    # stage 1 waits a second for stage 0, then both run the all-reduce and the step: no one finishes earlier
    assert [st["compute_s"] for st in late.stages] == [1.5, 0.5]
    assert late.iteration_time_s == pytest.approx(1.0 + op + 0.5, rel=1e-9)
    ends = {e.track: e.start + e.duration for e in late.events if e.name == "step"}
    assert ends["stage 0"] == pytest.approx(ends["stage 1"], rel=1e-12)
