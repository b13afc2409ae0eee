"""Collectives as NCCL runs them (lightrail.nccl_cost): NCCL's time and choice on the engine's links, in the replay
and the iteration simulator; ``engine.collectives: schedules`` keeps the textbook engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lightrail.fabric.params import RailFabric
from lightrail.nccl import algo_time, candidates, choose
from lightrail.nccl_cost import communicator, nccl_latency, nccl_op_cost, scaled_cost
from lightrail.scenario import parse_scenario
from lightrail.sharing import OpCost
from lightrail.sim.costs import FabricCost
from lightrail.sim.iteration import OpDurations
from lightrail.workload.chakra import TraceNode
from lightrail.workload.hardware import GPUS
from lightrail.workload.program import CollectiveOp, build_program

GIB = 2.0 ** 30
SIZES = [8.0, 4096.0, 2.0 ** 20, 64 * 2.0 ** 20, GIB]
FABRIC = RailFabric(kind="electrical")
ALONE = OpCost(1.0, np.array([3, 5, 7]), np.array([0.5, 0.25, 0.0]), bandwidth_s=0.5)


def comm(ranks, gpu="h100", g=8):
    return communicator(ranks, g, FABRIC, nvls=GPUS[gpu].nvls, arch=GPUS[gpu].arch)


def node(kind, nbytes):
    return TraceNode(id=0, name="c", op="collective", kind=kind, nbytes=nbytes)


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall"])
@pytest.mark.parametrize("ranks", [range(8), range(16), range(0, 64, 8)], ids=["node", "2-nodes", "rail"])
def test_the_bridge_takes_nccls_time_and_choice_at_each_size(kind, ranks):
    c = comm(ranks)
    for n in SIZES:
        cost, choice = nccl_op_cost(kind, n, c, alone=ALONE)
        expected = choose(kind, n, c)
        assert cost.seconds == float(expected.seconds[0])
        assert (choice.algorithm[0], choice.protocol[0]) == (expected.algorithm[0], expected.protocol[0])


@pytest.mark.parametrize("ranks", [range(8), range(32), range(0, 256, 8)], ids=["node", "4-nodes", "rail"])
def test_busy_seconds_are_scaled_so_the_bytes_move_in_nccls_time(ranks):
    c = comm(ranks)
    for n in SIZES:
        cost, choice = nccl_op_cost("allreduce", n, c, alone=ALONE)
        latency = float(nccl_latency("allreduce", choice.algorithm[0], choice.protocol[0], n, c))
        wire = cost.seconds - latency
        assert cost.wire_s == pytest.approx(wire, rel=1e-9, abs=1e-15)
        # the bottleneck (busy = the engine's wire) is busy for NCCL's bytes time; the others in proportion
        assert cost.busy_s == pytest.approx(np.array([1.0, 0.5, 0.0]) * wire, rel=1e-9, abs=1e-15)
        assert list(cost.links) == [3, 5, 7]
        assert np.all(cost.busy_s <= cost.wire_s * (1 + 1e-12))


def test_latency_is_algo_time_at_zero_bytes_but_for_the_ring_plateau():
    # ring Simple AllReduce across nodes: NCCL multiplies its latency by 1.4 (Hopper) once the buffer is large
    c = comm(range(0, 256, 8))
    zero = float(algo_time("allreduce", "ring", "Simple", 0.0, c))
    assert float(nccl_latency("allreduce", "ring", "Simple", 8.0, c)) == pytest.approx(zero)
    assert float(nccl_latency("allreduce", "ring", "Simple", GIB, c)) == pytest.approx(1.4 * zero, rel=1e-9)
    for algo, proto in [("tree", "LL"), ("tree", "Simple"), ("ring", "LL128")]:
        assert float(nccl_latency("allreduce", algo, proto, GIB, c)) == pytest.approx(
            float(algo_time("allreduce", algo, proto, 0.0, c)), rel=1e-9)


def test_a_forced_algorithm_is_honoured_and_its_schedule_asked_for():
    c = comm(range(16))
    asked = []
    for n in SIZES:
        cost, choice = nccl_op_cost("allreduce", n, c, alone=lambda name: asked.append(name) or ALONE,
                                    algorithm="ring")
        assert choice.algorithm[0] == "ring"
        assert cost.seconds == float(choose("allreduce", n, c, algorithm="ring").seconds[0])
    assert asked == ["ring"] * len(SIZES)
    _, free = nccl_op_cost("allreduce", GIB, c, alone=ALONE)
    assert free.algorithm[0] != "ring"  # left alone, NCCL's tuner prefers another algorithm at 1 GiB here


def test_an_op_that_moved_nothing_keeps_no_link_busy():
    cost = scaled_cost(OpCost(1e-6, np.array([1]), np.array([0.0]), bandwidth_s=0.0), 2e-6, 1e-6)
    assert cost.seconds == 2e-6 and list(cost.busy_s) == [0.0]


def test_nvls_is_offered_on_h100_and_b200_servers_not_on_a100_nor_one_gpu_per_server():
    for gpu, nvls in (("h100", True), ("h200", True), ("b200", True), ("a100", False)):
        pairs = candidates("allreduce", comm(range(8), gpu))
        assert (("nvls", "Simple") in pairs) is nvls
    assert ("nvls", "Simple") not in candidates("allreduce", comm(range(0, 64, 8)))  # DP on a rail: 1 GPU/node
    assert ("nvls-tree", "Simple") not in candidates("allreduce", comm(range(0, 64, 8)))
    assert comm([0, 1, 2, 8, 9, 10]).ppn == 3 and comm([0, 1, 2, 3, 8, 9]).ppn == 2  # gcd of GPUs per server


# -- the replay ------------------------------------------------------------------------------------------------
def test_a_replay_on_rails_picks_ll_for_small_and_simple_for_large_collectives():
    cost = FabricCost(16, RailFabric(kind="electrical"), 8, gpu=GPUS["h100"])
    group = tuple(range(16))
    assert cost.choice(node("allreduce", 8), group)[1] == "LL"
    assert cost.choice(node("allreduce", GIB), group)[1] == "Simple"
    assert cost.collective(node("allreduce", GIB), group).seconds == float(
        choose("allreduce", GIB, comm(group)).seconds[0])
    assert cost.collective(node("allreduce", GIB), (3,)).seconds == 0.0  # one rank: nothing to do


def test_a_scenario_carries_engine_collectives_and_defaults_to_nccl():
    base = {"name": "t", "model": "llama3-8b", "cluster": {"gpus": 16, "gpu": "h100"}, "parallel": {"tp": 8},
            "job": {"micro_batches": 2}}
    assert parse_scenario(base).build().fabric.collectives == "nccl"
    assert parse_scenario({**base, "engine": {"collectives": "schedules"}}).build().fabric.collectives == "schedules"


@pytest.mark.parametrize("p", [2, 4, 8])
def test_schedules_keep_the_textbook_ring_on_rails(p):
    # one GPU per server: ring AllReduce is 2(p-1) steps of N/p over GPU -> rail switch -> GPU (2 hops each)
    fab = RailFabric(kind="electrical", alpha=1e-6, latency=0.5e-6, nic_bandwidth=1e9, nvlink_bandwidth=1e9,
                     collectives="schedules")
    cost = FabricCost(p, fab, 1)
    n = 64e6
    expected = 2 * (p - 1) * (fab.alpha + 2 * fab.latency) + 2 * (p - 1) / p * n / fab.nic_bandwidth
    assert cost.collective(node("allreduce", n), tuple(range(p))).seconds == pytest.approx(expected, rel=1e-12)
    assert cost.choice(node("allreduce", n), tuple(range(p))) is None
    # and on another topology NCCL never applies (ASTRA-sim's world), whatever the switch says
    from lightrail.fabric.builders import ring

    on_ring = FabricCost(p, replace(fab, collectives="nccl"), topology=ring(p, bandwidth=1e9, latency=0.5e-6))
    assert on_ring.choice(node("allreduce", n), tuple(range(p))) is None


# -- the iteration simulator -----------------------------------------------------------------------------------
def _durations(kind, collectives="nccl", gpu="h100"):
    b = parse_scenario({"name": "t", "model": "llama3-8b", "cluster": {"gpus": 32, "gpu": gpu},
                        "parallel": {"tp": 8, "dp": 4}, "job": {"micro_batches": 2},
                        "engine": {"collectives": collectives}}).build()
    fabric = replace(b.fabric, kind=kind)
    program = build_program(b.job)
    from lightrail.control.opus import OpusPlanner

    planner = OpusPlanner(b.job.layout)
    return program, planner, OpDurations(program, fabric), b


def _first(program, dim):
    return next(op for op in program.stages[0] if isinstance(op, CollectiveOp) and op.dim.value == dim)


@pytest.mark.parametrize("kind", ["electrical", "photonic", "ideal"])
def test_iteration_ops_run_as_nccl_forcing_the_ring_on_circuits_across_servers(kind):
    program, planner, durations, b = _durations(kind)
    lay = b.job.layout
    dp, tp = _first(program, "dp"), _first(program, "tp")
    (req,) = planner.requirements(dp, 0)
    group = lay.groups_over(dp.group_dims)[0]
    forced = None if kind == "electrical" else "ring"
    assert durations.seconds(dp, 0, req) == float(choose(dp.kind, dp.nbytes, comm(group), algorithm=forced)
                                                   .seconds[0])
    # TP sits inside a server: NCCL's full choice everywhere (NVLS on an H100 server at large sizes)
    (req,) = planner.requirements(tp, 0)
    tp_choice = choose(tp.kind, tp.nbytes, comm(lay.groups_over(tp.group_dims)[0]))
    assert durations.seconds(tp, 0, req) == float(tp_choice.seconds[0])
    cost = durations.cost(tp, 0, req, 0)
    assert cost.seconds == durations.seconds(tp, 0, req)  # seconds() and cost() agree
    assert cost.busy_s.max() == pytest.approx(cost.wire_s, rel=1e-9)


def test_iteration_with_schedules_keeps_the_engines_numbers():
    program, planner, nccl, _ = _durations("electrical")
    _, _, engine, _ = _durations("electrical", "schedules")
    dp = _first(program, "dp")
    (req,) = planner.requirements(dp, 0)
    assert engine.seconds(dp, 0, req) == engine._time(req, dp.nbytes / 4)[0]  # the engine's own sum of steps
    assert nccl.seconds(dp, 0, req) != engine.seconds(dp, 0, req)
