"""Interleaved 1F1B (Megatron-LM's virtual pipeline stages): the order of forwards and backwards against a list
derived by hand from Megatron's rules, the sends across the wrap (FIFO per stage pair, one PP configuration for
the planner), the bubble cut by the number of chunks, both fabrics, and the refusals."""

from __future__ import annotations

import re
from math import prod

import pytest

from lightrail.control.opus import LIGHTRAIL, OpusPlanner
from lightrail.errors import ScenarioError
from lightrail.fabric.params import RailFabric
from lightrail.scenario import parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload import GPUS, ModelSpec
from lightrail.workload.parallel import Layout
from lightrail.workload.program import ComputeOp, RecvOp, SendOp, TrainingJob, _pipeline_order, build_program

# 16 layers (so pp x v of 2x2, 2x4, 4x2, 4x4, 8x2 all divide it); vocab 8 keeps the output layer on the last
# stage to ~0.03% of a stage's FLOPs, so the stages are as good as uniform for the bubble arithmetic.
MODEL = ModelSpec(name="m16", layers=16, hidden=256, ffn=1024, heads=4, kv_heads=4, vocab=8, seq_len=256)


def job(pp: int = 2, m: int = 4, schedule: str = "interleaved", v: int = 2, *, gpus_per_server: int = 1,
        **kw) -> TrainingJob:
    kw.setdefault("megatron_step", False)
    degrees = kw.pop("degrees", {})
    world = pp * prod(degrees.values())
    layout = Layout.from_degrees(world, pp=pp, gpus_per_server=gpus_per_server, **degrees)
    return TrainingJob(model=MODEL, layout=layout, gpu=GPUS["h100"], micro_batches=m, schedule=schedule,
                       virtual_stages=v, **kw)


def names(order) -> list[str]:
    return [f"{'B' if backward else 'F'}{j}.{c}" for j, backward, c in order]


# -- the order -------------------------------------------------------------------------------------------------
# Derived by hand from megatron/core/pipeline_parallel/schedules.py (NVIDIA/Megatron-LM main, commit d98e8a6):
# pp=2, v=2, m=4, microbatch_group_size_per_vp_stage = pp = 2. get_schedule_table: groups {0,1}, {2,3}, each
# through chunk 0 then chunk 1, so virtual micro-batch k = 0..7 is
#     (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1).
# Forward k runs that pair; backward k the same micro-batch on chunk v-1-c (get_model_chunk_id(k, forward=False)).
# get_pp_rank_microbatches: warm-up (pp - rank - 1) * 2 + (v - 1) * pp = 4 on rank 0, 2 on rank 1, of 8.
# Rank 0: forwards 0..3; then (F4, B0) (F5, B1) (F6, B2) (F7, B3); then B4..B7.
# Rank 1: forwards 0..1; then (F2, B0) ... (F7, B5); then B6, B7.
RANK0 = ["F0.0", "F1.0", "F0.1", "F1.1",
         "F2.0", "B0.1", "F3.0", "B1.1", "F2.1", "B0.0", "F3.1", "B1.0",
         "B2.1", "B3.1", "B2.0", "B3.0"]
RANK1 = ["F0.0", "F1.0",
         "F0.1", "B0.1", "F1.1", "B1.1", "F2.0", "B0.0", "F3.0", "B1.0", "F2.1", "B2.1", "F3.1", "B3.1",
         "B2.0", "B3.0"]


def test_order_pp2_v2_m4_is_megatrons():
    j = job()
    assert names(_pipeline_order(j, 0)) == RANK0
    assert names(_pipeline_order(j, 1)) == RANK1
    program = build_program(j)
    for s, expected in enumerate((RANK0, RANK1)):
        assert [op.label for op in program.stages[s] if isinstance(op, ComputeOp)] == expected


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (2, 8, 4), (4, 8, 2), (4, 4, 4), (8, 16, 2)])
def test_every_stage_runs_each_micro_batch_of_each_chunk_once_forward_then_backward(pp, m, v):
    j = job(pp, m, v=v)
    for s in range(pp):
        order = _pipeline_order(j, s)
        assert sorted(order) == sorted((mb, b, c) for mb in range(m) for b in (False, True) for c in range(v))
        for mb in range(m):
            for c in range(v):
                assert order.index((mb, False, c)) < order.index((mb, True, c))
        warmup = min((pp - s - 1) * 2 + (v - 1) * pp, m * v)
        assert [b for _, b, _ in order[:warmup]] == [False] * warmup and (warmup == m * v or order[warmup + 1][1])


# -- the sends across the wrap ---------------------------------------------------------------------------------
_LABEL = re.compile(r"([FB])(\d+)\.(\d+) ")


def _edges(program, a: int, b: int) -> tuple[list, list]:
    """(direction, micro-batch, sending virtual stage) of the sends from stage a to b, and of the receives at b
    from a, in program order."""
    pp = program.job.layout.pp
    sends, recvs = [], []
    for op in program.stages[a]:
        if isinstance(op, SendOp) and not op.phase and a + op.offset == b:
            d, mb, c = _LABEL.match(op.label).groups()
            sends.append((d, int(mb), int(c) * pp + a))
    for op in program.stages[b]:
        if isinstance(op, RecvOp) and b + op.offset == a:
            d, mb, c = _LABEL.match(op.label).groups()
            recvs.append((d, int(mb), int(c) * pp + b + (-1 if d == "F" else 1)))
    return sends, recvs


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (2, 8, 4), (4, 8, 2), (4, 8, 4), (8, 16, 2)])
def test_sends_match_receives_in_order_per_stage_pair(pp, m, v):
    """The simulator matches a receive with the oldest arrival from that stage (FIFO per (from, to)): so each
    pair's sends and receives must come in the same order, the wrap (last stage -> stage 0, offset -(pp - 1);
    stage 0 -> last stage backward) included, and for pp = 2 with forward and backward on one pair."""
    program = build_program(job(pp, m, v=v))
    wraps = 0
    for a in range(pp):
        for b in range(pp):
            if a != b:
                sends, recvs = _edges(program, a, b)
                assert sends == recvs
                if pp > 2 and abs(a - b) == pp - 1:
                    wraps += len(sends)
    assert wraps == (2 * m * (v - 1) if pp > 2 else 0)  # each of v-1 chunk boundaries, forward and backward


def test_planner_serves_the_wrap_in_one_pp_configuration():
    """split_pp puts a stage's downstream sends on the even rails and upstream on the odd: taken by the ring's
    direction, the wrap keeps the forward circuits one ring per rail (by the sign of the offset alone, stage 0
    would transmit to stage 1 and to the last stage on the same rails, and the PP phase would need two
    configurations and reconfigure within it)."""
    j = job(4, 8, v=2, gpus_per_server=4, degrees={"tp": 2, "dp": 2}, megatron_step=True)
    program = build_program(j)
    plan = OpusPlanner(j.layout, LIGHTRAIL).plan(program)
    assert sorted(name for name in plan.configurations if name.startswith("pp")) == ["pp"]
    plain = build_program(job(4, 8, "1f1b", 1, gpus_per_server=4, degrees={"tp": 2, "dp": 2}, megatron_step=True))
    assert sorted(OpusPlanner(j.layout, LIGHTRAIL).plan(plain).configurations) == sorted(plan.configurations)


# -- the bubble ------------------------------------------------------------------------------------------------
# Communication priced at nothing (no latency, no start-up, 1e18 B/s): the iteration is pure compute.
FREE = RailFabric(kind="electrical", latency=0.0, alpha=0.0, nic_bandwidth=1e18, nvlink_bandwidth=1e18)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (2, 8, 4), (4, 16, 2)])
def test_bubble_shrinks_by_the_number_of_chunks(pp, m, v):
    """Narayanan et al. (SC'21) sec. 2.2: with t the time of a micro-batch's forward and backward on a stage,
    1F1B takes (m + pp - 1) t, interleaved (m + (pp - 1) / v) t (bubble fractions (pp-1)/m and (pp-1)/(m v)).
    With communication free and even stages both are exact but for the output layer on the last stage
    (vocab 8: ~3e-4 of a stage's FLOPs), so 1e-3 relative bounds what is left; measured: < 1e-4."""
    plain = simulate_iteration(build_program(job(pp, m, "1f1b", 1)), FREE, LIGHTRAIL).iteration_time_s
    inter = simulate_iteration(build_program(job(pp, m, v=v)), FREE, LIGHTRAIL).iteration_time_s
    assert inter < plain
    assert inter / plain == pytest.approx((m + (pp - 1) / v) / (m + pp - 1), rel=1e-3)


def test_compute_per_chunk_is_its_layers_share():
    plain, inter = build_program(job(4, 4, "1f1b", 1)), build_program(job(4, 4, v=4))
    for s in range(4):
        f = {op.label: op.seconds for op in plain.stages[s] if isinstance(op, ComputeOp)}
        g = {op.label: op.seconds for op in inter.stages[s] if isinstance(op, ComputeOp)}
        if s < 3:  # no output layer: each chunk a quarter of the stage
            assert all(g[f"F0.{c}"] == pytest.approx(f["F0"] / 4) for c in range(4))
        assert sum(g[f"F0.{c}"] for c in range(4)) == pytest.approx(f["F0"])
        assert sum(g[f"B0.{c}"] for c in range(4)) == pytest.approx(f["B0"])
    assert job(4, 4, v=2).stage_layers(1) == (2, 3, 10, 11)
    assert list(job(4, 4, v=2).chunk_layers(3, 1)) == [14, 15]


@pytest.mark.parametrize("kind", ["electrical", "photonic"])
def test_both_fabrics_simulate(kind):
    j = job(4, 8, v=2, gpus_per_server=4, degrees={"tp": 2, "dp": 2}, megatron_step=True)
    program = build_program(j)
    result = simulate_iteration(program, RailFabric(kind=kind), LIGHTRAIL)
    plain = simulate_iteration(build_program(job(4, 8, "1f1b", 1, gpus_per_server=4, degrees={"tp": 2, "dp": 2},
                                                 megatron_step=True)), RailFabric(kind=kind), LIGHTRAIL)
    assert 0 < result.iteration_time_s < 1.5 * plain.iteration_time_s


# -- refusals --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "field"), [
    ({"v": 0}, "job.virtual_stages"),
    ({"v": 1}, "job.virtual_stages"),
    ({"v": 3}, "job.virtual_stages"),            # 16 layers do not split into 2 x 3 chunks
    ({"pp": 4, "v": 8, "m": 4}, "job.virtual_stages"),  # 4 x 8 = 32 chunks of 16 layers
    ({"m": 3}, "job.micro_batches"),             # not a multiple of pp = 2
    ({"pp": 4, "m": 6}, "job.micro_batches"),
    ({"schedule": "1f1b", "v": 2}, "job.virtual_stages"),
    ({"pipeline_layers": "balanced"}, "job.pipeline_layers"),
])
def test_bad_values_are_refused_naming_the_field(changes, field):
    with pytest.raises(ScenarioError) as err:
        job(**changes)
    assert err.value.field == field


def test_scenario_file_takes_interleaved():
    scenario = {"name": "t", "model": "debug", "cluster": {"gpus": 8, "gpus_per_server": 4},
                "parallel": {"tp": 2, "pp": 2}, "job": {"micro_batches": 4, "schedule": "interleaved",
                                                        "virtual_stages": 2}}
    built = parse_scenario(scenario).build()
    assert built.job.schedule == "interleaved" and built.job.virtual_stages == 2
    for bad, field in (({"virtual_stages": 0}, "job.virtual_stages"), ({"micro_batches": 3}, "job.micro_batches")):
        with pytest.raises(ScenarioError) as err:
            parse_scenario({**scenario, "job": {**scenario["job"], **bad}}).build()
        assert err.value.field == field
