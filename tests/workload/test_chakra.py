"""Chakra traces in: files written with mlc-chakra's own writer, read back, replayed against hand timelines."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

pytest.importorskip("chakra")

from chakra.schema.protobuf.et_def_pb2 import (  # noqa: E402
    ALL_REDUCE,
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    GATHER,
    GlobalMetadata,
)
from chakra.schema.protobuf.et_def_pb2 import AttributeProto as Attr  # noqa: E402
from chakra.schema.protobuf.et_def_pb2 import Node as ChakraNode  # noqa: E402
from chakra.src.third_party.utils.protolib import encodeMessage as encode_message  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.collectives import generate  # noqa: E402
from lightrail.defaults import Kind  # noqa: E402
from lightrail.errors import InfeasibleError, LightrailError  # noqa: E402
from lightrail.fabric.builders import rails  # noqa: E402
from lightrail.fabric.params import RailFabric  # noqa: E402
from lightrail.sim.replay import RailsCost, replay  # noqa: E402
from lightrail.timing import Engine  # noqa: E402
from lightrail.workload.chakra import ChakraTrace, TraceNode, decode_rank, encode_rank, read_chakra  # noqa: E402

B, ALPHA, HOP = 1e9, 1e-6, 0.5e-6
# the textbook step engine (engine.collectives: schedules): these tests pin its closed forms
FABRIC = RailFabric(kind="electrical", nic_bandwidth=B, nvlink_bandwidth=B, latency=HOP, alpha=ALPHA,
                    collectives="schedules")
MB = 1e6


def comp(i, us, deps=()):
    n = ChakraNode(id=i, name=f"C{i}", type=COMP_NODE, duration_micros=us)
    n.data_deps.extend(deps)
    return n


def coll(i, nbytes, deps=(), pg=None, ctype=ALL_REDUCE):
    n = ChakraNode(id=i, name=f"AR{i}", type=COMM_COLL_NODE)
    n.data_deps.extend(deps)
    n.attr.extend([Attr(name="comm_type", int64_val=ctype), Attr(name="comm_size", int64_val=int(nbytes))])
    if pg is not None:
        n.attr.append(Attr(name="pg_name", string_val=pg))
    return n


def p2p(i, send, src, dst, nbytes, deps=(), tag=7):
    n = ChakraNode(id=i, name=f"P{i}", type=COMM_SEND_NODE if send else COMM_RECV_NODE)
    n.data_deps.extend(deps)
    n.attr.extend([Attr(name="comm_src", int32_val=src), Attr(name="comm_dst", int32_val=dst),
                   Attr(name="comm_tag", int32_val=tag), Attr(name="comm_size", int64_val=int(nbytes))])
    return n


def write(folder, per_rank, groups=None, prefix="workload"):
    folder.mkdir(parents=True, exist_ok=True)
    for rank, nodes in enumerate(per_rank):
        with open(folder / f"{prefix}.{rank}.et", "wb") as f:
            encode_message(f, GlobalMetadata(version="0.0.4"))
            for node in nodes:
                encode_message(f, node)
    if groups is not None:
        (folder / f"{prefix}.json").write_text(json.dumps(groups))
    return folder


def run_trace(folder, gpus_per_server=1):
    trace = read_chakra(folder)
    cost = RailsCost(trace.world, FABRIC, gpus_per_server)
    return trace, replay(trace, cost.collective, cost.transfer)


def ring_allreduce_2(nbytes):
    """Two GPUs on one rail switch: two steps of N/2 bytes, each 2 hops: 2(alpha + 2 hop) + N/B."""
    return 2 * (ALPHA + 2 * HOP) + nbytes / B


def test_overlap_and_the_compute_stream_follow_a_hand_timeline(tmp_path):
    # rank 0: C1 (10us) and C5 (7us) ready at once run in file order on the one compute stream; the
    # all-reduce waits for rank 1 (20us); C3 overlaps it; C4 needs both.
    rank0 = [comp(1, 10), coll(2, MB, [1]), comp(3, 30, [1]), comp(4, 5, [2, 3]), comp(5, 7)]
    rank1 = [comp(1, 20), coll(2, MB, [1]), comp(3, 30, [1]), comp(4, 5, [2, 3])]
    trace, result = run_trace(write(tmp_path / "t", [rank0, rank1]))
    ar = ring_allreduce_2(MB)
    assert result.iteration_time_s == pytest.approx(20e-6 + ar + 5e-6, rel=1e-12)
    starts = {(e.track, e.name): e.start for e in result.events}
    assert starts[("rank 0", "C5")] == pytest.approx(10e-6)
    assert starts[("rank 0", "C3")] == pytest.approx(17e-6)  # waited for C5 on the stream, not for the all-reduce
    assert starts[("rank 0 comm", "AR2")] == pytest.approx(20e-6)
    assert starts[("rank 1", "C4")] == pytest.approx(20e-6 + ar)
    assert result.per_rank[0]["compute_s"] == pytest.approx(52e-6)
    assert trace.ops() == {"collective": 2, "collective:allreduce": 2, "compute": 7}


def test_send_and_receive_match_by_tag(tmp_path):
    rank0 = [comp(1, 10), p2p(2, True, 0, 1, MB, [1], tag=3), p2p(3, True, 0, 1, 2 * MB, [2], tag=4)]
    rank1 = [p2p(1, False, 0, 1, 2 * MB, tag=4), p2p(2, False, 0, 1, MB, tag=3), comp(3, 5, [1, 2])]
    _, result = run_trace(write(tmp_path / "t", [rank0, rank1]))
    hop = lambda n: ALPHA + 2 * HOP + n / B  # noqa: E731
    assert result.iteration_time_s == pytest.approx(10e-6 + hop(MB) + hop(2 * MB) + 5e-6, rel=1e-12)


def test_groups_from_the_comm_group_file_and_from_the_nodes(tmp_path):
    # four GPUs, two per server: groups {0,1} (NVLink) and {2,3}; then all four over the rails
    per_rank = [[coll(1, MB, pg="1" if r < 2 else "2"), coll(2, MB, [1], pg="0")] for r in range(4)]
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}
    trace = read_chakra(write(tmp_path / "a", per_rank, groups))
    assert trace.groups == {"0": (0, 1, 2, 3), "1": (0, 1), "2": (2, 3)}
    assert read_chakra(write(tmp_path / "b", per_rank)).groups == trace.groups  # inferred from pg_name
    cost = RailsCost(4, FABRIC, 2)
    result = replay(trace, cost.collective, cost.transfer)
    # the two pairs' collectives run at once on disjoint links: nothing shared, so one after the other's time
    assert result.iteration_time_s == pytest.approx(cost.collective(trace.ranks[0][0], (0, 1)).seconds
                                                    + cost.collective(trace.ranks[0][1], (0, 1, 2, 3)).seconds)
    assert cost.collective(trace.ranks[0][0], (0, 1)).seconds == pytest.approx(2 * (ALPHA + 2 * HOP) + MB / B)
    # a group's schedule is timed on its own GPUs: as the engine placing it there
    engine = Engine(rails(4, gpus_per_server=2, nic_bandwidth=B, nvlink_bandwidth=B, latency=HOP), alpha=ALPHA,
                    placement=np.array([1, 2, 3]))
    node = trace.ranks[0][1]
    assert cost.collective(node, (1, 2, 3)).seconds == pytest.approx(
        engine.time(generate("allreduce", "auto", 3), MB).time_s, rel=1e-12)


@pytest.mark.parametrize("case, message", [
    ("missing", "rank 1 has no file"),
    ("gather", "GATHER has no lightrail schedule"),
    ("mismatch", "different collectives"),
    ("dangling", "depends on node 9"),
])
def test_bad_traces_name_the_fault(tmp_path, case, message):
    folder = tmp_path / case
    if case == "missing":
        write(folder, [[comp(1, 1)], [comp(1, 1)], [comp(1, 1)]])
        (folder / "workload.1.et").unlink()
    elif case == "gather":
        write(folder, [[coll(1, MB, ctype=GATHER)]] * 2)
    elif case == "mismatch":
        write(folder, [[coll(1, MB)], [comp(1, 3)]])
    else:
        write(folder, [[comp(1, 1, [9])]])
    with pytest.raises(LightrailError, match=message):
        read_chakra(folder)


def test_a_cycle_is_reported_not_hung(tmp_path):
    trace = read_chakra(write(tmp_path / "c", [[comp(1, 1, [2]), comp(2, 1, [1])]]))
    cost = RailsCost(1, FABRIC, 1)
    with pytest.raises(InfeasibleError, match="never finishes"):
        replay(trace, cost.collective, cost.transfer)


def test_import_chakra_cli_contract(tmp_path):
    folder = write(tmp_path / "t", [[comp(1, 10), coll(2, MB, [1])], [comp(1, 20), coll(2, MB, [1])]])
    result = CliRunner().invoke(app, ["import", "chakra", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ranks"] == 2
    assert data["ops"]["compute"] == 2 and data["ops"]["collective:allreduce"] == 2
    bad = CliRunner().invoke(app, ["import", "chakra", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "error:" in bad.output and "Traceback" not in bad.output


def test_a_scenario_names_a_trace_and_simulate_runs_it(tmp_path, monkeypatch):
    folder = write(tmp_path / "traces", [[comp(1, 10), coll(2, MB, [1])], [comp(1, 20), coll(2, MB, [1])]])
    scenario = {"name": "traced", "workload": {"chakra": "traces"},
                "cluster": {"gpus": 2, "gpus_per_server": 1, "rail_bandwidth": "8Gbps", "nvlink_bandwidth": "1GBps",
                            "latency": "0.5us", "alpha": "1us"},
                "engine": {"collectives": "schedules"}}  # the hand timeline's textbook ring
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert folder.exists()
    runner = CliRunner()
    check = runner.invoke(app, ["check", str(path)])
    assert check.exit_code == 0, check.output
    assert "2 ranks" in check.output
    result = runner.invoke(app, ["simulate", str(path), "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["iteration_time_s"] == pytest.approx(20e-6 + ring_allreduce_2(MB), rel=1e-9)
    assert (tmp_path / "out" / "trace.json").exists()
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    quiet = runner.invoke(app, ["simulate", str(path), "--json"])
    assert quiet.exit_code == 0 and json.loads(quiet.output)["ranks"] == 2
    assert list((tmp_path / "here").iterdir()) == []  # --json alone writes nothing
    wrong = {**scenario, "cluster": {**scenario["cluster"], "gpus": 4}}
    path.write_text(yaml.safe_dump(wrong))
    bad = runner.invoke(app, ["simulate", str(path)])
    assert bad.exit_code == 2 and "cluster.gpus" in bad.output


@st.composite
def compute_dags(draw):
    n = draw(st.integers(1, 12))
    micros = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    deps = [tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else () for i in range(n)]
    return [TraceNode(i, f"C{i}", "compute", deps[i], seconds=micros[i] * 1e-6) for i in range(n)]


@given(compute_dags())
@settings(max_examples=60, deadline=None)
def test_one_rank_of_compute_is_never_idle(nodes):
    """One compute stream and an acyclic graph: some node is always ready, so the rank ends after the sum of
    its durations, and every node starts after all it depends on."""
    result = replay(ChakraTrace((tuple(nodes),)), lambda *_: 0.0, lambda *_: 0.0)
    assert result.iteration_time_s == pytest.approx(sum(n.seconds for n in nodes), abs=1e-12)
    start = {e.name: e.start for e in result.events}
    end = {e.name: e.start + e.duration for e in result.events}
    for n in nodes:
        for d in n.deps:
            if f"C{d}" in end and f"C{n.id}" in start:
                assert start[f"C{n.id}"] >= end[f"C{d}"] - 1e-12


@given(compute_dags(), st.integers(0, 7))
@settings(max_examples=40, deadline=None)
def test_encode_then_decode_is_the_identity(nodes, rank):
    nodes = [n if n.id % 3 else TraceNode(n.id, n.name, "collective", n.deps, kind=Kind.ALLGATHER,
                                          nbytes=float(1000 * n.id), group="7") for n in nodes]
    nodes = [TraceNode(n.id, n.name, n.op, n.deps, seconds=round(n.seconds * 1e6) * 1e-6, kind=n.kind,
                       nbytes=n.nbytes, group=n.group) for n in nodes]
    back = decode_rank(encode_rank(nodes, rank))
    assert [(b.id, b.op, b.deps, b.kind, b.nbytes, b.group) for b in back] == \
        [(n.id, n.op, n.deps, n.kind, n.nbytes, n.group) for n in nodes]
    assert [b.seconds for b in back] == pytest.approx([n.seconds for n in nodes])


def test_allgather_comm_size_is_each_ranks_contribution(tmp_path):
    """Chakra's ALL_GATHER comm_size is what each rank contributes (ASTRA-sim moves (n-1) x comm_size per rank);
    lightrail's nbytes is the whole gathered buffer: read multiplies by the group size, export divides back."""
    from chakra.schema.protobuf.et_def_pb2 import ALL_GATHER

    from lightrail.report.export import write_astra_sim

    write(tmp_path / "in", [[coll(0, 3 * MB, ctype=ALL_GATHER, pg="tp")] for _ in range(4)], {"tp": [0, 1, 2, 3]})
    trace = read_chakra(tmp_path / "in")
    assert [n.nbytes for nodes in trace.ranks for n in nodes] == [12 * MB] * 4
    write_astra_sim(trace, tmp_path / "out", name="ag", network={}, system={})
    back = read_chakra(tmp_path / "out")
    assert [n.nbytes for nodes in back.ranks for n in nodes] == [12 * MB] * 4
    raw = decode_rank((tmp_path / "out" / "workload.0.et").read_bytes())
    assert [n.nbytes for n in raw] == [3 * MB]
