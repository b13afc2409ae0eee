"""Rank layout and the 1F1B training program: layout arithmetic and its refusals, Megatron rank order
against brute force, job validation, 1F1B order and pipeline matching, and bytes/seconds per op by hand."""

from __future__ import annotations

import re
from collections import Counter, deque
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError
from lightrail.workload import GPUS, ModelSpec
from lightrail.workload.parallel import ORDER, Dim, Layout
from lightrail.workload.program import CollectiveOp, ComputeOp, RecvOp, SendOp, TrainingJob, build_program

H100 = GPUS["h100"]

# -- a small model with round numbers, by hand ---------------------------------------------------------
# 4 layers, hidden 64, ffn 256, 4 heads (head_dim 16), 2 KV heads (kv_dim 32), vocab 1000, seq 128, bf16.
SMALL = ModelSpec(name="small", layers=4, hidden=64, ffn=256, heads=4, kv_heads=2, vocab=1000, seq_len=128,
                  dtype_bytes=2)
ATTN = 64 * 64 + 2 * 64 * 32 + 64 * 64          # q + k,v + o = 12_288
MLP = 3 * 64 * 256                              # gate, up, down = 49_152
NORMS = 2 * 64                                  # = 128
LAYER = ATTN + MLP + NORMS                      # = 61_568
EMBED = 1000 * 64                               # one of input embedding / output projection = 64_000
TOKENS = 128                                    # micro_batch_size 1, cp 1
ACT = TOKENS * 64 * 2                           # residual stream of one micro-batch = 16_384 bytes
LAYER_FLOPS = 2 * (ATTN + MLP) * TOKENS + 2 * TOKENS * 128 * 64   # matmuls + causal attention = 17_825_792
LOGITS_FLOPS = 2 * 1000 * 64 * TOKENS                             # = 16_384_000


def small_moe(**changes) -> ModelSpec:
    """SMALL with 4 routed experts (top 2, width 128) after ``dense_layers`` dense layers."""
    return SMALL.with_(**{"name": "small-moe", "experts": 4, "top_k": 2, "moe_ffn": 128, "dense_layers": 1,
                          **changes})


def job(model: ModelSpec = SMALL, layout: Layout | None = None, **kw) -> TrainingJob:
    layout = layout or Layout.from_degrees(8, tp=2, dp=2, pp=2, gpus_per_server=4)
    kw.setdefault("micro_batches", 4)
    return TrainingJob(model=model, layout=layout, gpu=H100, **kw)


def is_dp(op) -> bool:
    """A gradient bucket or a parameter all-gather (the step's loss all-reduce is on dp too, labelled loss)."""
    return isinstance(op, CollectiveOp) and op.dim is Dim.DP and op.label.startswith("dp ")


def computes(ops) -> list[ComputeOp]:
    return [op for op in ops if isinstance(op, ComputeOp)]


# -- Layout.from_degrees ----------------------------------------------------------------------------


def test_product_rule_shows_the_arithmetic():
    with pytest.raises(InfeasibleError, match=re.escape("tp(8) * cp(1) * ep(1) * dp(2) * pp(1) = 16 != GPUs(32)")) \
            as err:
        Layout.from_degrees(32, tp=8, dp=2)
    assert err.value.field == "parallel"
    with pytest.raises(InfeasibleError, match=re.escape("tp(2) * cp(2) * ep(1) * dp(3) * pp(2) = 24 != GPUs(16)")):
        Layout.from_degrees(16, tp=2, cp=2, dp=3, pp=2, gpus_per_server=4)


@pytest.mark.parametrize(("world", "degrees", "rest", "expected"), [
    (64, {"tp": 4, "cp": 2, "pp": 2}, "dp", 4),
    (64, {"tp": 8, "dp": 2, "pp": -1}, "pp", 4),
    (16, {"tp": -1, "dp": 2}, "tp", 8),
    (32, {"tp": 2, "cp": -1, "dp": 1, "pp": 2}, "cp", 8),
    (32, {"tp": 4, "ep": -1, "dp": 2, "pp": 2}, "ep", 2),
    (8, {"tp": 8}, "dp", 1),
])
def test_minus_one_is_the_rest(world, degrees, rest, expected):
    lay = Layout.from_degrees(world, **degrees)
    assert lay.degree(rest) == expected
    assert lay.world == world
    for d in ORDER:
        if d.value != rest:
            assert lay.degree(d) == degrees.get(d.value, 1)


def test_rest_must_divide_the_world():
    with pytest.raises(InfeasibleError, match="not divisible by the other degrees' product 8") as err:
        Layout.from_degrees(20, tp=4, pp=2, gpus_per_server=4)
    assert err.value.field == "parallel.dp"


def test_two_minus_ones_are_refused():
    with pytest.raises(InfeasibleError, match="only one degree may be -1, got dp, pp") as err:
        Layout.from_degrees(64, dp=-1, pp=-1)
    assert err.value.field == "parallel.pp"
    with pytest.raises(InfeasibleError, match="got tp, cp") as err:
        Layout.from_degrees(64, tp=-1, cp=-1, dp=1)
    assert err.value.field == "parallel.cp"


@pytest.mark.parametrize(("world", "tp", "g"), [(32, 16, 8), (16, 16, 8), (24, 3, 8), (16, 8, 4)])
def test_tp_must_fit_in_a_server(world, tp, g):
    with pytest.raises(InfeasibleError, match=f"tp={tp} does not fit servers of {g} GPUs") as err:
        Layout.from_degrees(world, tp=tp, gpus_per_server=g)
    assert err.value.field == "parallel.tp"


@pytest.mark.parametrize(("world", "pp", "g", "stage"), [(32, 8, 8, 4), (48, 4, 8, 12), (16, 8, 4, 2)])
def test_stages_must_fill_whole_servers(world, pp, g, stage):
    with pytest.raises(InfeasibleError, match=f"stage of {stage} GPUs does not fill whole servers of {g}") as err:
        Layout.from_degrees(world, pp=pp, gpus_per_server=g)
    assert err.value.field == "parallel.pp"


@pytest.mark.parametrize("dim", [d.value for d in ORDER])
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_degrees_are_refused(dim, value):
    degrees = {"tp": 1, "cp": 1, "ep": 1, "dp": 1, "pp": 1, dim: value}
    with pytest.raises(InfeasibleError, match=f"{dim}={value} must be at least 1") as err:
        Layout.from_degrees(8, **degrees)
    assert err.value.field == f"parallel.{dim}"


def test_world_must_fill_servers_but_may_be_one_partial_server():
    with pytest.raises(InfeasibleError) as err:
        Layout.from_degrees(12, gpus_per_server=8)
    assert err.value.field == "cluster.gpus"
    small = Layout.from_degrees(4, tp=2, pp=2, gpus_per_server=8)
    assert (small.world, small.servers, small.dp) == (4, 1, 1)


# -- Megatron rank order against brute force --------------------------------------------------------

LAYOUTS = [  # (world, tp, cp, ep, dp, pp, gpus_per_server), all accepted by from_degrees
    (16, 2, 1, 1, 4, 2, 8),
    (16, 4, 2, 1, 2, 1, 4),
    (24, 2, 3, 1, 2, 2, 4),
    (32, 2, 2, 2, 2, 2, 8),
    (32, 4, 2, 1, 2, 2, 4),
    (36, 3, 1, 2, 3, 2, 6),
    (48, 4, 1, 3, 2, 2, 4),
    (64, 8, 1, 2, 2, 2, 8),
    (64, 4, 2, 1, 4, 2, 8),
    (64, 1, 1, 1, 4, 16, 4),
]


MEGATRON = ("tp", "cp", "ep", "dp", "pp")  # fastest first, written out so that ORDER itself is under test


def brute_coords(lay: Layout) -> dict[int, tuple[int, ...]]:
    """rank -> (tp, cp, ep, dp, pp) coordinates, enumerated in Megatron order."""
    TP, CP, EP, DP, PP = lay.tp, lay.cp, lay.ep, lay.dp, lay.pp
    table = {}
    for pp, dp, ep, cp, tp in product(range(PP), range(DP), range(EP), range(CP), range(TP)):
        table[tp + TP * (cp + CP * (ep + EP * (dp + DP * pp)))] = (tp, cp, ep, dp, pp)
    return table


def brute_groups(lay: Layout, dim: Dim) -> set[tuple[int, ...]]:
    """Groups of ``dim``: ranks agreeing on every other coordinate, ordered by their ``dim`` coordinate."""
    axis = MEGATRON.index(dim.value)
    found: dict[tuple[int, ...], dict[int, int]] = {}
    for rank, c in brute_coords(lay).items():
        found.setdefault(c[:axis] + c[axis + 1:], {})[c[axis]] = rank
    return {tuple(members[k] for k in range(lay.degree(dim))) for members in found.values()}


def check_against_brute_force(lay: Layout) -> None:
    table = brute_coords(lay)
    assert sorted(table) == list(range(lay.world))  # the formula is a bijection onto 0..world-1
    ranks = np.arange(lay.world)
    coords = lay.coords(ranks)
    assert [d.value for d in ORDER] == list(MEGATRON)
    for axis, name in enumerate(MEGATRON):
        assert coords[Dim(name)].tolist() == [table[r][axis] for r in ranks]
    for d in ORDER:
        groups = lay.groups(d)
        assert groups.shape == (lay.world // lay.degree(d), lay.degree(d))
        assert {tuple(row) for row in groups.tolist()} == brute_groups(lay, d)
        assert sorted(groups.ravel().tolist()) == list(range(lay.world))  # a partition
        for row in groups:
            c = lay.coords(row)
            assert c[d].tolist() == list(range(lay.degree(d)))
            for other in ORDER:
                if other is not d:
                    assert len(set(c[other].tolist())) == 1  # members differ only along d
    for s in range(lay.pp):
        assert lay.stage_ranks(s).tolist() == [r for r in ranks if table[r][4] == s]


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: "w{}-tp{}-cp{}-ep{}-dp{}-pp{}-g{}".format(*s))
def test_rank_order_matches_brute_force(spec):
    world, tp, cp, ep, dp, pp, g = spec
    lay = Layout.from_degrees(world, tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, gpus_per_server=g)
    check_against_brute_force(lay)
    ranks = np.arange(world)
    assert lay.server(ranks).tolist() == [r // g for r in ranks]
    assert lay.rail(ranks).tolist() == [r % g for r in ranks]
    assert lay.servers == world // g
    # tp divides gpus_per_server (from_degrees insists), so a tp group never straddles servers
    for row in lay.groups(Dim.TP):
        assert len(set(lay.server(row).tolist())) == 1
    # every pipeline stage fills whole servers, so no server holds two stages
    stage_servers = [set(lay.server(lay.stage_ranks(s)).tolist()) for s in range(pp)]
    assert sum(map(len, stage_servers)) == len(set().union(*stage_servers)) == lay.servers


@pytest.mark.parametrize("spec", [s for s in LAYOUTS if s[1] == s[6]],
                         ids=lambda s: "w{}-tp{}-cp{}-ep{}-dp{}-pp{}-g{}".format(*s))
def test_dp_group_lies_on_one_rail_when_tp_fills_a_server(spec):
    world, tp, cp, ep, dp, pp, g = spec
    lay = Layout.from_degrees(world, tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, gpus_per_server=g)
    for row in lay.groups(Dim.DP):
        assert len(set(lay.rail(row).tolist())) == 1
        assert len(set(lay.server(row).tolist())) == dp  # one member per server


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]),
       st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 4]))
def test_groups_and_coords_match_brute_force_for_any_degrees(tp, cp, ep, dp, pp):
    check_against_brute_force(Layout(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, gpus_per_server=4))


def test_dim_accepts_its_name():
    lay = Layout.from_degrees(16, tp=2, cp=2, pp=2, gpus_per_server=4)
    for d in ORDER:
        assert np.array_equal(lay.groups(d.value), lay.groups(d))
    assert {d.value: lay.stride(d.value) for d in ORDER} == {"tp": 1, "cp": 2, "ep": 4, "dp": 4, "pp": 8}
    assert str(lay) == "TP2 x CP2 x DP2 x PP2"


# -- TrainingJob validation -------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "layout", "field", "message"), [
    (SMALL, Layout.from_degrees(3, pp=3, gpus_per_server=1), "parallel.pp", "4 layers do not split into pp=3"),
    (SMALL.with_(hidden=96, heads=6, kv_heads=2), Layout.from_degrees(8, tp=4, gpus_per_server=4), "parallel.tp",
     "6 heads do not split over tp=4"),
    (SMALL, Layout.from_degrees(8, tp=2, ep=2, dp=2, gpus_per_server=4), "parallel.ep",
     "ep=2 needs a mixture-of-experts"),
    (SMALL, Layout.from_degrees(8, tp=4, dp=2, gpus_per_server=4), "parallel.tp",
     "2 key-value heads do not split over tp=4"),
    (small_moe(experts=6), Layout.from_degrees(8, tp=2, ep=4, gpus_per_server=4), "parallel.ep",
     "6 experts do not split over ep=4"),
    (SMALL, Layout.from_degrees(6, tp=2, cp=3, gpus_per_server=2), "parallel.cp",
     "sequence length 128 does not split over cp=3"),
])
def test_job_refuses_layouts_the_model_cannot_split_over(model, layout, field, message):
    with pytest.raises(InfeasibleError, match=re.escape(message)) as err:
        job(model, layout)
    assert err.value.field == field


@pytest.mark.parametrize(("kw", "field"), [
    ({"mfu": 0.0}, "job.mfu"),
    ({"mfu": -0.1}, "job.mfu"),
    ({"mfu": 1.01}, "job.mfu"),
    ({"mfu": float("nan")}, "job.mfu"),
    ({"micro_batches": 0}, "job.micro_batches"),
    ({"micro_batches": -3}, "job.micro_batches"),
    ({"micro_batch_size": 0}, "job.micro_batch_size"),
    ({"dp_buckets": 0}, "job.dp_buckets"),
])
def test_job_refuses_bad_settings(kw, field):
    with pytest.raises(InfeasibleError) as err:
        job(**kw)
    assert err.value.field == field


def test_job_accepts_the_edges_of_its_ranges():
    assert job(mfu=1.0, micro_batches=1, dp_buckets=1).mfu == 1.0
    moe = job(small_moe(), Layout.from_degrees(8, tp=2, ep=4, gpus_per_server=4))
    assert moe.layout.ep == 4


# -- 1F1B order -------------------------------------------------------------------------------------


def pipeline(p: int, m: int) -> list[tuple]:
    model = ModelSpec(name="tiny", layers=2 * p, hidden=8, ffn=16, heads=2, kv_heads=1, vocab=16, seq_len=4)
    return list(build_program(job(model, Layout.from_degrees(p, pp=p, gpus_per_server=1), micro_batches=m)).stages)


def run_pipeline(stages) -> None:
    """Execute the stages with buffered sends; a RecvOp waits for its neighbour's SendOp, whose label it must carry."""
    p = len(stages)
    pos = [0] * p
    channels: dict[tuple[int, int], deque] = {}
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(stages[s]):
                op = stages[s][pos[s]]
                if isinstance(op, SendOp):
                    assert 0 <= s + op.offset < p
                    channels.setdefault((s, s + op.offset), deque()).append(op.label)
                elif isinstance(op, RecvOp):
                    queue = channels.get((s + op.offset, s))
                    if not queue:
                        break
                    assert queue.popleft() == op.label
                pos[s] += 1
                moved = True
    assert pos == [len(ops) for ops in stages], f"deadlock at {pos}"
    assert all(not q for q in channels.values())


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8), st.integers(1, 12))
def test_one_f_one_b(p, m):
    stages = pipeline(p, m)
    assert len(stages) == p
    for s, ops in enumerate(stages):
        order = [(c.label[0], int(c.label[1:])) for c in computes(ops)]
        fwd = [j for kind, j in order if kind == "F"]
        bwd = [j for kind, j in order if kind == "B"]
        assert fwd == list(range(m)) and bwd == list(range(m))   # each once, in increasing order
        for j in range(m):
            assert order.index(("F", j)) < order.index(("B", j))
        # Megatron: min(p - s - 1, m) warm-up forwards, then 1F1B steady state starting with a forward
        warmup = min(p - s - 1, m)
        first_b = order.index(("B", 0))
        assert first_b == (warmup + 1 if m > warmup else m)
        assert first_b == min(p - s, m)
        kinds = "".join(kind for kind, _ in order)
        assert "FF" not in kinds[first_b:]                      # steady state alternates, then cool-down
        in_flight = np.cumsum([1 if k == "F" else -1 for k in kinds])
        assert in_flight.max() == min(p - s, m)                  # 1F1B memory bound

        sends = {off: [op.label for op in ops if isinstance(op, SendOp) and op.offset == off] for off in (-1, 1)}
        recvs = {off: [op.label for op in ops if isinstance(op, RecvOp) and op.offset == off] for off in (-1, 1)}
        assert len(sends[1]) == (m if s < p - 1 else 0)
        assert len(recvs[-1]) == (m if s > 0 else 0)
        assert len(sends[-1]) == (m if s > 0 else 0)
        assert len(recvs[1]) == (m if s < p - 1 else 0)
        if s < p - 1:
            assert sends[1] == [f"F{j} act" for j in range(m)]
            assert recvs[1] == [f"B{j} grad" for j in range(m)]
        if s > 0:
            assert recvs[-1] == [f"F{j} act" for j in range(m)]
            assert sends[-1] == [f"B{j} grad" for j in range(m)]
    for s in range(p - 1):  # the k-th send of s is the k-th receive of s+1, in both directions
        down = [op.label for op in stages[s] if isinstance(op, SendOp) and op.offset == 1]
        up = [op.label for op in stages[s + 1] if isinstance(op, RecvOp) and op.offset == -1]
        assert down == up
        back = [op.label for op in stages[s + 1] if isinstance(op, SendOp) and op.offset == -1]
        back_in = [op.label for op in stages[s] if isinstance(op, RecvOp) and op.offset == 1]
        assert back == back_in
    run_pipeline(stages)


def test_one_f_one_b_exact_order_p4_m6():
    stages = pipeline(4, 6)
    assert [c.label for c in computes(stages[0])] == \
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5".split()
    assert [c.label for c in computes(stages[2])] == \
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5".split()
    assert [c.label for c in computes(stages[3])] == \
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5".split()


# -- bytes and seconds by hand ----------------------------------------------------------------------


def test_small_model_by_hand():
    assert (SMALL.head_dim, SMALL.kv_dim) == (16, 32)
    assert SMALL.layer_params(0) == LAYER == 61_568
    assert SMALL.layer_flops(0, TOKENS) == LAYER_FLOPS == 17_825_792
    assert SMALL.logits_flops(TOKENS) == LOGITS_FLOPS


def test_tp_and_pp_bytes():
    m = 4
    prog = build_program(job(micro_batches=m))
    for s, ops in enumerate(prog.stages):
        tp = [op for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.TP]
        assert len(tp) == 2 * m  # one per forward and one per backward
        assert {(op.kind, op.nbytes, op.count) for op in tp} == {("allreduce", ACT, 2 * 2)}  # 2 layers per stage
        sends = [op for op in ops if isinstance(op, SendOp)]
        assert len(sends) == m
        assert {(op.offset, op.nbytes, op.dim) for op in sends} == {(1 if s == 0 else -1, ACT / 2, Dim.PP)}
        assert not any(isinstance(op, CollectiveOp) and op.dim in (Dim.CP, Dim.EP) for op in ops)
    assert prog.count(SendOp) == prog.count(RecvOp) == 2 * m


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("buckets", [1, 3])
@pytest.mark.parametrize("grad_bytes", [2, 4])
def test_dp_bytes_are_the_stage_gradients(tied, buckets, grad_bytes):
    model = SMALL.with_(tied_embeddings=tied)
    prog = build_program(job(model, dp_buckets=buckets, grad_bytes=grad_bytes, overlap_grad_reduce=True))
    # embedding first; final norm and output projection last: with pp 2 a tied output layer is the last stage's own
    # copy of the embedding (Megatron's GPTModel), whose gradient the embedding group all-reduces
    params = [2 * LAYER + EMBED, 2 * LAYER + SMALL.hidden + EMBED]
    for s, ops in enumerate(prog.stages):
        total = params[s] // 2 * grad_bytes                          # tp = 2 shards every weight
        dp = [op for op in ops if is_dp(op)]
        assert [op.label for op in dp] == [f"dp bucket {k}" for k in range(buckets)]
        assert all(op.kind == "allreduce" and op.count == 1 for op in dp)
        # finalize_model_grads waits for the last bucket: it is launched synchronously
        assert [op.asynchronous for op in dp] == [True] * (buckets - 1) + [False]
        assert [op.nbytes for op in dp] == pytest.approx([total / buckets] * buckets)
        assert sum(op.nbytes for op in dp) == pytest.approx(total)
    # without overlap_grad_reduce (Megatron's default) one bucket per buffer, whatever dp_buckets says
    plain = build_program(job(model, dp_buckets=buckets, grad_bytes=grad_bytes))
    for s, ops in enumerate(plain.stages):
        dp = [op for op in ops if is_dp(op)]
        assert [(op.label, op.nbytes, op.asynchronous) for op in dp] == [("dp bucket 0", params[s] // 2 * grad_bytes,
                                                                          False)]


def test_dp_bytes_hand_figure():
    prog = build_program(job(dp_buckets=4))  # fp32 gradients, as Megatron reduces them
    assert [sum(op.nbytes for op in ops if is_dp(op)) for ops in prog.stages] == [374_272, 374_272 + 128]


@pytest.mark.parametrize("buckets", [1, 4])
def test_zero_reduce_scatters_each_bucket_and_gathers_each_after_the_step(buckets):
    prog = build_program(job(zero=True, dp_buckets=buckets, overlap_grad_reduce=True))
    for s, ops in enumerate(prog.stages):
        params = (2 * LAYER + EMBED + s * SMALL.hidden) // 2  # tp = 2 shards every weight
        dp = [op for op in ops if is_dp(op)]
        assert [op.kind for op in dp] == ["reducescatter"] * buckets + ["allgather"] * buckets
        # fp32 gradients scattered, bf16 parameters gathered
        assert [op.nbytes for op in dp] == pytest.approx([params * 4 / buckets] * buckets
                                                         + [params * 2 / buckets] * buckets)
        assert [op.asynchronous for op in dp] == [True] * (buckets - 1) + [False] * (buckets + 1)
        # the parameters come back after the optimizer's grad norm, before train_step's reductions
        gather = ops.index(dp[buckets])
        assert ops[gather - 1].megatron == "get_grad_norm_fp32"
        assert [op.megatron for op in ops[gather + buckets:gather + buckets + 2]] == [
            "logical_and_across_model_parallel_group", "reduce_max_stat_across_model_parallel_group"]


def test_no_dp_sync_without_data_parallelism():
    prog = build_program(job(SMALL.with_(kv_heads=4), Layout.from_degrees(8, tp=4, pp=2, gpus_per_server=4),
                             dp_buckets=3))
    assert not any(is_dp(op) for ops in prog.stages for op in ops)
    assert all(c.label[-1].isdigit() and "." not in c.label for ops in prog.stages for c in computes(ops))


def test_cp_passes_kv_per_micro_batch():
    m = 3
    lay = Layout.from_degrees(8, tp=2, cp=2, pp=2, gpus_per_server=4)
    prog = build_program(job(layout=lay, micro_batches=m))
    tokens = 128 // 2                                   # each cp rank holds half of the sequence
    kv = 2 * (tokens * 2) * (32 // 2) * 2               # K and V of the whole sequence, the rank's kv heads, bf16
    assert kv == 8192
    for ops in prog.stages:
        cp = [op for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.CP]
        assert [op.kind for op in cp].count("allgather") == m
        assert [op.kind for op in cp].count("reducescatter") == m
        assert {(op.nbytes, op.count) for op in cp} == {(kv, 2)}   # once per layer, 2 layers per stage
        for op in cp:  # forward gathers, backward scatters the gradients
            assert op.kind == ("allgather" if op.label.startswith("F") else "reducescatter")
        tp = [op for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.TP]
        assert {op.nbytes for op in tp} == {tokens * 64 * 2}
        assert {op.nbytes for op in ops if isinstance(op, SendOp)} == {tokens * 64 * 2 / 2}


@pytest.mark.parametrize(("dense_layers", "moe_per_stage"), [(1, [1, 2]), (2, [0, 2]), (0, [2, 2])])
def test_ep_alltoall_per_micro_batch(dense_layers, moe_per_stage):
    m = 3
    lay = Layout.from_degrees(8, tp=2, ep=2, pp=2, gpus_per_server=4)
    prog = build_program(job(small_moe(dense_layers=dense_layers), lay, micro_batches=m))
    dispatch = TOKENS * 2 * 64 * 2 / 2                   # tokens * top_k * hidden * bf16 / tp
    for ops, moe in zip(prog.stages, moe_per_stage, strict=True):
        ep = [op for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.EP]
        if moe == 0:
            assert ep == []
            continue
        assert len(ep) == 2 * m                          # forward and backward of each micro-batch
        assert {(op.kind, op.nbytes, op.count) for op in ep} == {("alltoall", dispatch, 2 * moe)}


@pytest.mark.parametrize("mfu", [0.5, 0.25])
@pytest.mark.parametrize("buckets", [1, 4])
def test_compute_seconds_by_roofline(mfu, buckets):
    m = 4
    prog = build_program(job(mfu=mfu, micro_batches=m, dp_buckets=buckets, overlap_grad_reduce=True))
    flops = [2 * LAYER_FLOPS, 2 * LAYER_FLOPS + LOGITS_FLOPS]         # logits on the last stage
    assert flops == [sum(SMALL.layer_flops(i, TOKENS) for i in range(2)),
                     sum(SMALL.layer_flops(i, TOKENS) for i in range(2, 4)) + SMALL.logits_flops(TOKENS)]
    for ops, f in zip(prog.stages, flops, strict=True):
        fwd = f / 2 / (H100.peak_flops * mfu)                         # tp = 2 splits every matmul
        by_label: dict[str, float] = {}
        for c in computes(ops):
            key = c.label.split(".")[0]
            by_label[key] = by_label.get(key, 0.0) + c.seconds
        assert set(by_label) == {f"{k}{j}" for k in "FB" for j in range(m)}
        for j in range(m):
            assert by_label[f"F{j}"] == pytest.approx(fwd, rel=1e-12)
            assert by_label[f"B{j}"] == pytest.approx(2 * fwd, rel=1e-12)
        last = [c for c in computes(ops) if c.label.startswith(f"B{m - 1}")]
        assert len(last) == buckets                                   # the last backward is cut per bucket
        assert [c.seconds for c in last] == pytest.approx([2 * fwd / buckets] * buckets, rel=1e-12)
        assert sum(c.seconds for c in computes(ops)) == pytest.approx(3 * m * fwd, rel=1e-12)


def test_micro_batch_size_scales_tokens():
    prog = build_program(job(micro_batch_size=3))
    assert {op.nbytes for op in prog.stages[0] if isinstance(op, SendOp)} == {3 * ACT / 2}
    one = build_program(job())
    f1 = next(c.seconds for c in computes(one.stages[0]) if c.label == "F0")
    f3 = next(c.seconds for c in computes(prog.stages[0]) if c.label == "F0")
    # matmuls scale with tokens, and so does the causal attention term (each sequence is seq_len long)
    assert f3 == pytest.approx(3 * f1, rel=1e-12)


# -- deferring the gradient sync --------------------------------------------------------------------


@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize(("world", "pp"), [(8, 2), (16, 4)])
def test_defer_dp_moves_the_sync_after_the_last_send(zero, world, pp):
    lay = Layout.from_degrees(world, tp=2, dp=2, pp=pp, gpus_per_server=4)
    j = job(layout=lay, micro_batches=5, zero=zero, dp_buckets=3, overlap_grad_reduce=True)
    eager, deferred = build_program(j), build_program(j, defer_dp=True)
    assert (eager.notes["defer_dp"], deferred.notes["defer_dp"]) == (False, True)
    for s, (a, b) in enumerate(zip(eager.stages, deferred.stages, strict=True)):
        assert Counter(a) == Counter(b)                                    # same ops
        assert [op for op in a if not is_dp(op)] == [op for op in b if not is_dp(op)]
        assert [op for op in a if is_dp(op)] == [op for op in b if is_dp(op)]
        buckets = [i for i, op in enumerate(b) if is_dp(op) and op.label.startswith("dp bucket")]
        assert len(buckets) == 3 and sum(map(is_dp, b)) == 3 + 3 * zero  # with zero, a gather per bucket
        assert buckets == list(range(buckets[0], buckets[0] + 3))          # a closing phase of its own
        step = [op.megatron for op in b[buckets[-1] + 1:]]                 # then Megatron's step
        assert step[0] == "get_grad_norm_fp32"
        last_op = "train_step.loss_reduced" if s == lay.pp - 1 else "reduce_max_stat_across_model_parallel_group"
        assert step[-1] == last_op
        last_send = max(i for i, op in enumerate(b) if isinstance(op, SendOp))
        assert buckets[0] > last_send
        assert [b[i].asynchronous for i in buckets] == [True, True, False]  # finalize_model_grads waits for the last
        if s > 0:  # by default the buckets overlap the last backward, ahead of its gradient send
            first_dp = min(i for i, op in enumerate(a) if is_dp(op))
            assert first_dp < max(i for i, op in enumerate(a) if isinstance(op, SendOp))


# -- ops_for_rank -----------------------------------------------------------------------------------


def test_ops_for_rank_is_the_stage_list():
    lay = Layout.from_degrees(16, tp=2, dp=2, pp=4, gpus_per_server=4)
    prog = build_program(job(layout=lay, micro_batches=6))
    for s in range(lay.pp):
        for r in lay.stage_ranks(s):
            assert prog.ops_for_rank(int(r)) is prog.stages[s]
    assert len(set(prog.stages)) == lay.pp  # the stages really differ, so the lookup is tested
    for bad in (-1, 16, 100):
        with pytest.raises(InfeasibleError, match=f"rank {bad} is not in 0..15") as err:
            prog.ops_for_rank(bad)
        assert err.value.field == "rank"


def test_dense_gradients_reduce_over_every_replica_and_experts_over_theirs():
    # ep and cp ranks see different data, so dense weights are synced over cp x ep x dp and experts,
    # which each ep rank owns, over cp x dp.
    moe = small_moe(experts=4)
    prog = build_program(job(moe, Layout.from_degrees(16, tp=2, cp=2, ep=2, dp=2, gpus_per_server=4)))
    dp = [op for op in prog.stages[0] if is_dp(op)]
    spans = {op.label.split()[-1]: op.group_dims for op in dp}
    assert spans == {"dense": (Dim.CP, Dim.EP, Dim.DP), "experts": (Dim.CP, Dim.DP)}
    dense, expert = prog.job.stage_params(0)
    assert sum(op.nbytes for op in dp if op.label.endswith("dense")) == dense * 4  # fp32 gradients
    assert sum(op.nbytes for op in dp if op.label.endswith("experts")) == expert * 4
    # with dp = 1 the ep replicas of dense weights still need their sync
    only_ep = build_program(job(moe, Layout.from_degrees(8, tp=2, ep=4, gpus_per_server=4), micro_batches=4))
    assert [op.group_dims for op in only_ep.stages[0] if is_dp(op)] == [(Dim.CP, Dim.EP, Dim.DP)]


def test_scenario_job_defaults_are_the_jobs_except_the_buckets():
    from dataclasses import MISSING, fields

    from lightrail.scenario import JobSection
    from lightrail.workload.program import SCENARIO_DP_BUCKETS

    defaults = {f.name: f.default for f in fields(TrainingJob) if f.default is not MISSING}
    section = JobSection(micro_batches=1).model_dump()
    assert set(section) - {"micro_batches"} == set(defaults) - {"model", "layout", "gpu"}
    # a scenario overlaps the gradient sync with the backward; the bare job keeps one bucket
    assert (section.pop("dp_buckets"), defaults.pop("dp_buckets")) == (SCENARIO_DP_BUCKETS, 1)
    assert {k: v for k, v in section.items() if k in defaults} == defaults


def _ep_ops(prog):
    return [op for ops in prog.stages for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.EP]


def test_ep_alltoall_bytes_follow_the_moe_layers_traffic_formulas():
    """EP all-to-alls carry lightrail.moe.traffic's buffer: payload by default (the routed tokens; the engine
    sends (ep-1)/ep of it, the rest stays local), padded with a capacity factor, payload scaled by imbalance."""
    from lightrail.moe import traffic

    lay = Layout.from_degrees(8, tp=2, ep=4, gpus_per_server=4)
    model = small_moe()
    wire = {}
    for style, kw in (("payload", {}), ("padded", {"moe_dispatch": "padded", "capacity_factor": 1.5}),
                      ("imbalanced", {"moe_imbalance": 1.3})):
        prog = build_program(job(model, lay, **kw))
        want = traffic.alltoall_buffer_bytes("padded" if style == "padded" else "payload", TOKENS, 2, 64, 2, 4, 4,
                                             capacity_factor=kw.get("capacity_factor", 1.0),
                                             imbalance=kw.get("moe_imbalance", 1.0)) / 2
        assert {op.nbytes for op in _ep_ops(prog)} == {want}
        wire[style] = want * 2 * 3 / 4  # undo /tp, keep the (ep-1)/ep that leaves the rank
    assert wire["payload"] == traffic.payload_bytes(TOKENS, 2, 64, 2, 4) == TOKENS * 2 * 64 * 2 * 3 / 4
    assert wire["padded"] == traffic.padded_bytes(TOKENS, 2, 64, 2, 4, 4, 1.5)
    assert wire["padded"] > wire["payload"]
    assert wire["imbalanced"] == pytest.approx(1.3 * wire["payload"])


@pytest.mark.parametrize(("kw", "field"), [({"moe_dispatch": "dense"}, "job.moe_dispatch"),
                                           ({"capacity_factor": 0}, "job.capacity_factor"),
                                           ({"moe_imbalance": 0.5}, "job.moe_imbalance")])
def test_moe_dispatch_options_are_checked(kw, field):
    with pytest.raises(InfeasibleError) as e:
        job(small_moe(), Layout.from_degrees(8, tp=2, ep=4, gpus_per_server=4), **kw)
    assert e.value.field == field
