"""Chakra traces on any fabric: ASTRA-sim's microbenchmark (one collective on a ring or a switch of n NPUs, as
``benchmarks/vs_astra_sim.py`` writes it) replayed from a scenario by ``lightrail simulate`` gives the step
engine's closed forms, with and without its endpoint-delay and local-memory terms; bad fields exit 2 naming
them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

pytest.importorskip("chakra")

from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.collectives import generate  # noqa: E402
from lightrail.defaults import Kind  # noqa: E402
from lightrail.errors import ScenarioError  # noqa: E402
from lightrail.fabric.builders import ring, switch  # noqa: E402
from lightrail.fabric.params import RailFabric  # noqa: E402
from lightrail.scenario import parse_scenario  # noqa: E402
from lightrail.sharing import OpCost  # noqa: E402
from lightrail.sim.costs import EngineTerms, FabricCost  # noqa: E402
from lightrail.sim.replay import RailsCost  # noqa: E402
from lightrail.timing import Engine  # noqa: E402
from lightrail.workload.chakra import TraceNode, encode_rank  # noqa: E402

N, B, HOP, ALPHA = 2**30, 50e9, 500e-9, 1e-6
runner = CliRunner()


def microbenchmark(folder, ranks, op="allreduce", nbytes=N):
    """One collective per rank, as benchmarks/vs_astra_sim.py writes ASTRA-sim's workload."""
    folder.mkdir(parents=True, exist_ok=True)
    node = TraceNode(id=0, name=op, op="collective", kind=Kind(op), nbytes=nbytes)
    for rank in range(ranks):
        (folder / f"workload.{rank}.et").write_bytes(encode_rank([node], rank))
    return folder


def scenario(ranks, topology, **engine):
    data = {"name": f"{topology}-{ranks}", "workload": {"chakra": "traces"},
            "cluster": {"gpus": ranks, "topology": topology, "rail_bandwidth": "50GBps", "latency": "500ns",
                        "alpha": "1us"}}
    if engine:
        data["engine"] = engine
    return data


def simulate(tmp_path, data, *, ranks=None):
    ranks = ranks or data["cluster"]["gpus"]
    if not (tmp_path / "traces").exists():
        microbenchmark(tmp_path / "traces", ranks)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return runner.invoke(app, ["simulate", str(path), "--json"])


def ring_allreduce(p, *, hops, delay=0.0, mem_bw=None):
    """2(p-1) steps of N/p bytes, each alpha + its path's latency; the endpoint delay once per step and once more;
    p-1 reducing steps of one chunk each, 3 N/p / mem_bw."""
    t = 2 * (p - 1) * (ALPHA + hops * HOP) + 2 * (p - 1) / p * N / B + (2 * (p - 1) + 1) * delay
    return t + ((p - 1) * 3 * (N / p) / mem_bw if mem_bw else 0.0)


@pytest.mark.parametrize("p", [2, 3, 8, 16])
@pytest.mark.parametrize("topology, hops", [("ring", 1), ("switch", 2)])
def test_one_allreduce_on_a_ring_or_switch_is_the_closed_form(tmp_path, p, topology, hops):
    result = simulate(tmp_path, scenario(p, topology))
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["iteration_time_s"] == pytest.approx(ring_allreduce(p, hops=hops), rel=1e-12)
    assert out["fabric"] == topology and out["topology"] == f"{topology}(n={p})"
    assert out["ranks"] == p and out["communication_s"] == pytest.approx(out["iteration_time_s"], rel=1e-12)


@pytest.mark.parametrize("topology, hops", [("ring", 1), ("switch", 2)])
def test_the_engine_terms_add_what_the_engine_charges(tmp_path, topology, hops):
    p = 8
    delayed = simulate(tmp_path, scenario(p, topology, endpoint_delay="10ns"))
    assert delayed.exit_code == 0, delayed.output
    bare = ring_allreduce(p, hops=hops)
    # (steps + 1) endpoint delays: 2(p-1) + 1 = 15 of 10 ns
    assert json.loads(delayed.output)["iteration_time_s"] == pytest.approx(bare + 15 * 10e-9, rel=1e-12)
    both = simulate(tmp_path, scenario(p, topology, endpoint_delay="10ns", local_mem_bw="1600GBps"))
    assert both.exit_code == 0, both.output
    assert json.loads(both.output)["iteration_time_s"] == pytest.approx(
        ring_allreduce(p, hops=hops, delay=10e-9, mem_bw=1600e9), rel=1e-12)
    zero = simulate(tmp_path, scenario(p, topology, endpoint_delay=0, sharing="none"))  # a bare 0 is no time
    assert zero.exit_code == 0, zero.output
    assert json.loads(zero.output)["iteration_time_s"] == pytest.approx(bare, rel=1e-12)
    assert json.loads(zero.output)["sharing"] == "none"


def test_rails_stay_the_default_and_report_electrical(tmp_path):
    data = scenario(4, "rails")
    del data["cluster"]["topology"]
    data["cluster"]["gpus_per_server"] = 1  # one GPU per server: GPU -> rail switch -> GPU, as the switch
    data["engine"] = {**data.get("engine", {}), "collectives": "schedules"}  # the textbook ring, as on the switch
    result = simulate(tmp_path, data)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["fabric"] == "electrical" and out["topology"].startswith("rails(n=4")
    assert out["iteration_time_s"] == pytest.approx(ring_allreduce(4, hops=2), rel=1e-12)
    # by default a trace's collectives on rails run as NCCL runs them: NCCL's tuner's time for the group
    from lightrail.nccl import choose
    from lightrail.nccl_cost import communicator
    from lightrail.workload.hardware import gpu

    del data["engine"]["collectives"]
    out = json.loads(simulate(tmp_path, data).output)
    c = data["cluster"]
    h = gpu(c.get("gpu", "h200"))
    fabric = RailFabric(nic_bandwidth=B, nvlink_bandwidth=h.nvlink_bandwidth)
    comm = communicator(np.arange(4), 1, fabric, nvls=h.nvls, arch=h.arch)
    assert out["iteration_time_s"] == pytest.approx(float(choose("allreduce", [N], comm).seconds[0]), rel=1e-9)


def test_torus_and_fat_tree_take_their_arguments(tmp_path):
    microbenchmark(tmp_path / "traces", 8)
    torus = parse_scenario({**scenario(8, "torus"), "cluster": {**scenario(8, "torus")["cluster"],
                                                               "shape": [2, 2, 2]}}).build(tmp_path)
    assert torus.topology.name == "torus(2x2x2)" and torus.scenario.topology_kind == "torus3d"
    tree = scenario(8, "fat_tree")
    tree["cluster"].update(hosts_per_leaf=4, oversubscription=2)
    built = parse_scenario(tree).build(tmp_path)
    assert built.topology.name == "fat_tree(n=8,k=4,over=2)" and built.scenario.topology_kind == "fat-tree"
    for data in (torus.scenario.model_dump(), tree):
        assert simulate(tmp_path, data).exit_code == 0


def test_the_cost_is_an_opcost_the_engine_would_give(tmp_path):
    """On the whole ring, a group's cost is Engine.op_cost of its schedule (time, links, busy seconds); on a
    group of some GPUs, the schedule's steps are mapped onto them."""
    topo = ring(8, bandwidth=B, latency=HOP)
    terms = EngineTerms(endpoint_delay=10e-9, local_mem_bw=1600e9)
    cost = FabricCost(8, RailFabric(alpha=ALPHA), topology=topo, terms=terms)
    node = TraceNode(id=0, name="ar", op="collective", kind=Kind.ALLREDUCE, nbytes=N)
    got = cost.collective(node, tuple(range(8)))
    want = Engine(topo, alpha=ALPHA, endpoint_delay=10e-9, local_mem_bw=1600e9).op_cost(
        generate("allreduce", "auto", 8), N)
    assert isinstance(got, OpCost) and got.seconds == pytest.approx(want.seconds, rel=1e-12)
    assert np.array_equal(got.links, want.links) and np.allclose(got.busy_s, want.busy_s, rtol=1e-12)
    assert cost.collective(node, tuple(range(8))) is got  # cached
    # GPUs 1, 3, 5 of a switch: the group's ring on those GPUs' links
    sw = FabricCost(8, RailFabric(alpha=ALPHA), topology=switch(8, bandwidth=B, latency=HOP))
    sub = sw.collective(node, (1, 3, 5))
    placed = Engine(switch(8, bandwidth=B, latency=HOP), alpha=ALPHA, placement=np.array([1, 3, 5]))
    assert sub.seconds == pytest.approx(placed.time(generate("allreduce", "auto", 3), N).time_s, rel=1e-12)
    assert sub.seconds == pytest.approx(ring_allreduce(3, hops=2), rel=1e-12)
    assert set(sw._engine.topology.src[sub.links]) | set(sw._engine.topology.dst[sub.links]) == {1, 3, 5, 8}
    assert cost.collective(node, (4,)).seconds == 0.0  # one rank: nothing to do
    p2p = cost.transfer(0, 2, 1e6)
    assert isinstance(p2p, OpCost) and p2p.seconds == pytest.approx(ALPHA + 2 * HOP + 1e6 / B, rel=1e-12)
    assert RailsCost is FabricCost


@pytest.mark.parametrize("change, field", [
    ({"cluster": {"topology": "hypercube"}}, "cluster.topology"),
    ({"engine": {"endpoint_delay": 5}}, "engine.endpoint_delay"),
    ({"engine": {"endpoint_delay": "5"}}, "engine.endpoint_delay"),
    ({"engine": {"local_mem_bw": "fast"}}, "engine.local_mem_bw"),
    ({"engine": {"sharing": "some"}}, "engine.sharing"),
    ({"cluster": {"topology": "ring", "shape": [2, 4]}}, "cluster.shape"),
    ({"cluster": {"topology": "torus", "shape": [3, 3]}}, "cluster.shape"),
    ({"cluster": {"topology": "switch", "hosts_per_leaf": 4}}, "cluster.hosts_per_leaf"),
])
def test_bad_values_exit_2_naming_the_field(tmp_path, change, field):
    data = scenario(8, "ring")
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values}
    result = simulate(tmp_path, data, ranks=8)
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output


def test_a_model_scenario_runs_on_rails_only(tmp_path):
    model = {"model": "debug", "cluster": {"gpus": 8, "gpus_per_server": 4, "topology": "ring"},
             "job": {"micro_batches": 2}}
    with pytest.raises(ScenarioError, match="cluster.topology") as e:
        parse_scenario(model).build()
    assert "workload" in str(e.value)  # the fix: replay a trace on it
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(model))
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and "cluster.topology" in result.output
    delayed = {**model, "cluster": {"gpus": 8, "gpus_per_server": 4}, "engine": {"endpoint_delay": "10ns"}}
    with pytest.raises(ScenarioError, match="engine.endpoint_delay"):
        parse_scenario(delayed).build()
    shared = {**delayed, "engine": {"sharing": "none"}}
    assert parse_scenario(shared).build().fabric.sharing == "none"  # engine.sharing reaches the rails


def test_time_not_computing_is_called_waiting_not_idle(tmp_path):
    """A rank whose collective is on the wire is busy: the replay calls iteration time minus compute "waiting"
    (on communication or peers), in the JSON and in the table, never "idle" (issue 33 item 5)."""
    result = simulate(tmp_path, scenario(4, "ring"))
    out = json.loads(result.output)
    assert "idle_s" not in out and out["waiting_s"] == pytest.approx(out["iteration_time_s"] - out["compute_s"])
    assert all("idle_s" not in r and "waiting_s" in r for r in out["per_rank"])
    text = runner.invoke(app, ["simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")])
    assert text.exit_code == 0, text.output
    assert "waiting" in text.output and "idle" not in text.output
