"""Megatron-LM's step after the last backward: the exact ops each knob puts there, derived by hand for the debug
model on tp2 x pp2 x dp2 (8 GPUs in servers of 4), the defaults against Megatron's, the old ``zero`` spelling,
the planner's phases for groups over stages, and every example still simulating."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lightrail.collectives.collective import Kind
from lightrail.control.opus import LIGHTRAIL, OpusPlanner
from lightrail.control.plan import phase_key
from lightrail.errors import LightrailError, ScenarioError
from lightrail.fabric.params import RailFabric
from lightrail.scenario import JobSection, load_scenario, parse_scenario
from lightrail.sim.iteration import simulate_iteration
from lightrail.workload import GPUS, preset
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.program import CollectiveOp, ComputeOp, RecvOp, SendOp, TrainingJob, build_program

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEBUG = preset("debug")  # 4 layers, hidden 256, ffn 1024, 4 heads, vocab 1024, untied
H, V = 256, 1024
LAYER = 4 * H * H + 3 * H * 1024 + 2 * H  # q, k, v, o + gate, up, down + two norms = 1_049_088
# Per rank (tp 2 shards every weight): stage 0 holds 2 layers and the embedding, stage 1 2 layers, the final norm
# and the output layer.
GRADS = [(2 * LAYER + V * H) // 2 * 4, (2 * LAYER + H + V * H) // 2 * 4]   # fp32 bytes: 4_720_640, 4_721_152
# Megatron reduces bf16 training's gradients in fp32 (arguments.py validate_args); parameters gather in bf16.
PARAMS = [g // 2 for g in GRADS]
TP_PP = (Dim.TP, Dim.PP)
REPLICAS = (Dim.CP, Dim.EP, Dim.DP)


def job(model=DEBUG, layout=None, **kw) -> TrainingJob:
    layout = layout or Layout.from_degrees(8, tp=2, pp=2, dp=2, gpus_per_server=4)
    return TrainingJob(model=model, layout=layout, gpu=GPUS["h100"], micro_batches=2, **kw)


def after_last_backward(program, stage: int) -> list:
    """The ops after the stage's last backward compute, with the names they carry."""
    ops = program.stages[stage]
    last = max(i for i, op in enumerate(ops) if isinstance(op, ComputeOp))
    return [(type(op).__name__, op.label, getattr(op, "megatron", ""), getattr(op, "kind", None),
             getattr(op, "group_dims", None), getattr(op, "nbytes", None), getattr(op, "asynchronous", False))
            for op in ops[last + 1:]]


def norm_ops(stage_last: bool) -> list:
    """get_grad_norm_fp32, then train_step's two model-parallel reductions, and the loss on the last stage."""
    ops = [("CollectiveOp", "grad norm", "get_grad_norm_fp32", Kind.ALLREDUCE, TP_PP, 4, False),
           ("CollectiveOp", "update successful", "logical_and_across_model_parallel_group", Kind.ALLREDUCE, TP_PP, 4,
            False),
           ("CollectiveOp", "grad norm max", "reduce_max_stat_across_model_parallel_group", Kind.ALLREDUCE, TP_PP, 4,
            False)]
    if stage_last:
        ops.append(("CollectiveOp", "loss", "train_step.loss_reduced", Kind.ALLREDUCE, REPLICAS, 8, False))
    return ops


ACT = 256 * H * 2  # one micro-batch's residual stream: seq_len 256 tokens x hidden, bf16


def tp_backward(stage: int) -> list:
    """The last backward's own ops: its tp all-reduces (4, one op), and on stage 1 the gradient's 1/tp share sent."""
    return [("CollectiveOp", "B1 tp", "copy_to_tensor_model_parallel_region", Kind.ALLREDUCE, (Dim.TP,), ACT,
             False)] + ([("SendOp", "B1 grad", "send_backward", None, (Dim.PP,), ACT / 2, False)] if stage else [])


def dp(label, kind, nbytes, asynchronous=False, name="start_grad_sync"):
    return ("CollectiveOp", label, name, kind, REPLICAS, nbytes, asynchronous)


# -- the defaults --------------------------------------------------------------------------------------------


def test_defaults_are_megatrons():
    """megatron/training/arguments.py: --use-distributed-optimizer, --overlap-grad-reduce, --overlap-param-gather
    are store_true (off), --clip-grad defaults to 1.0; ModelParallelConfig.sequence_parallel is False."""
    j = job()
    assert (j.distributed_optimizer, j.zero, j.overlap_grad_reduce, j.overlap_param_gather, j.sequence_parallel,
            j.grad_clip, j.megatron_step) == (False, False, False, False, False, 1.0, True)
    section = JobSection(micro_batches=1)
    assert (section.distributed_optimizer, section.zero, section.overlap_grad_reduce, section.overlap_param_gather,
            section.sequence_parallel, section.grad_clip, section.megatron_step) == (None, None, False, False, False,
                                                                                    1.0, True)


def test_default_step_by_hand():
    """No overlap: one synchronous bucket per stage after the backward's own ops, then the grad norm over tp x pp,
    train_step's two reductions over tp x pp, and the loss over dp on the last stage. No num-tokens all-reduce
    (calculate_per_token_loss is off), no embedding all-reduce (untied), no layernorm all-reduce (no SP)."""
    prog = build_program(job())
    for s in (0, 1):
        assert after_last_backward(prog, s) == tp_backward(s) + [dp("dp bucket 0", Kind.ALLREDUCE, GRADS[s])] + \
            norm_ops(s == 1)


# -- one test per knob ----------------------------------------------------------------------------------------


def test_overlap_grad_reduce_launches_buckets_during_the_backward_and_waits_for_the_last():
    prog = build_program(job(overlap_grad_reduce=True, dp_buckets=2))
    for s in (0, 1):
        ops = prog.stages[s]
        first = next(i for i, op in enumerate(ops) if op.label == "B1.0")
        assert list(ops[first + 1:first + 3]) == [
            CollectiveOp(Dim.DP, Kind.ALLREDUCE, GRADS[s] / 2, "dp bucket 0", asynchronous=True, span=REPLICAS),
            ComputeOp(ops[first].seconds, "B1.1")]
        assert after_last_backward(prog, s) == tp_backward(s) + [dp("dp bucket 1", Kind.ALLREDUCE, GRADS[s] / 2)] + \
            norm_ops(s == 1)


def test_distributed_optimizer_reduce_scatters_and_gathers_after_the_step():
    """Its grad stats group is the whole world (intra_dist_opt_group): the grad norm spans every dimension."""
    prog = build_program(job(distributed_optimizer=True))
    world = (Dim.TP, Dim.CP, Dim.EP, Dim.DP, Dim.PP)
    for s in (0, 1):
        norm, *train = norm_ops(s == 1)
        assert after_last_backward(prog, s) == tp_backward(s) + [
            dp("dp bucket 0", Kind.REDUCESCATTER, GRADS[s]),
            ("CollectiveOp", "grad norm", "get_grad_norm_fp32", Kind.ALLREDUCE, world, 4, False),
            dp("dp allgather 0", Kind.ALLGATHER, PARAMS[s], name="start_param_sync")] + train


def test_zero_is_the_old_spelling_of_distributed_optimizer():
    assert build_program(job(zero=True)).stages == build_program(job(distributed_optimizer=True)).stages
    assert job(zero=True).distributed_optimizer and job(distributed_optimizer=True).zero
    assert job(zero=True, distributed_optimizer=True).zero
    with pytest.raises(ScenarioError, match="disagrees") as err:
        job(zero=True, distributed_optimizer=False)
    assert err.value.field == "job.zero"
    scenario = {"name": "t", "model": "debug", "cluster": {"gpus": 8, "gpus_per_server": 4},
                "parallel": {"tp": 2, "pp": 2}, "job": {"micro_batches": 2, "zero": True}}
    assert parse_scenario(scenario).build().job.distributed_optimizer
    with pytest.raises(ScenarioError) as err:
        parse_scenario({**scenario, "job": {"micro_batches": 2, "zero": False, "distributed_optimizer": True}}).build()
    assert err.value.field == "job.zero"


def test_overlap_param_gather_runs_the_gathers_behind_the_next_forward():
    prog = build_program(job(distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                             dp_buckets=2))
    for s in (0, 1):
        ops = prog.stages[s]
        start = 0  # before the first forward's receive
        assert list(ops[start:start + 2]) == [
            CollectiveOp(Dim.DP, Kind.ALLGATHER, PARAMS[s] / 2, f"dp allgather {k}", asynchronous=True, span=REPLICAS)
            for k in range(2)]
        assert not any(op.label.startswith("dp allgather") for op in ops[2:])
    for bad, missing in (({"distributed_optimizer": True}, "overlap_grad_reduce"),
                         ({"overlap_grad_reduce": True}, "distributed_optimizer")):
        with pytest.raises(ScenarioError, match=missing) as err:
            job(overlap_param_gather=True, **bad)
        assert err.value.field == "job.overlap_param_gather"


def test_sequence_parallel_gathers_and_scatters_and_all_reduces_the_norms_over_tp():
    prog = build_program(job(sequence_parallel=True))
    act = ACT
    for s in (0, 1):
        ops = prog.stages[s]
        f0 = [op for op in ops if isinstance(op, CollectiveOp) and op.label.startswith("F0 tp")]
        assert [(op.kind, op.nbytes, op.count, op.megatron) for op in f0] == [
            (Kind.ALLGATHER, act, 4, "gather_from_sequence_parallel_region"),
            (Kind.REDUCESCATTER, act, 4, "reduce_scatter_to_sequence_parallel_region")]
        norms = 2 * (2 * H) + (H if s == 1 else 0)  # two norms per layer, the final norm on the last stage
        step = after_last_backward(prog, s)
        layernorm = ("CollectiveOp", "layernorm grads", "_allreduce_non_tensor_model_parallel_grads", Kind.ALLREDUCE,
                     (Dim.TP,), norms * 4, False)  # fp32 gradients
        assert step[step.index(dp("dp bucket 0", Kind.ALLREDUCE, GRADS[s])) + 1] == layernorm
    # Megatron turns sequence parallelism off without tensor parallelism: nothing changes
    one = Layout.from_degrees(8, pp=2, dp=4, gpus_per_server=4)
    assert build_program(job(layout=one, sequence_parallel=True)).stages == build_program(job(layout=one)).stages


def test_grad_clip_adds_no_collective():
    """ChainedOptimizer.step reduces the grad norm whatever --clip-grad is (for the log); clipping scales in place."""
    assert build_program(job(grad_clip=0.0)).stages == build_program(job(grad_clip=1.0)).stages
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ScenarioError) as err:
            job(grad_clip=bad)
        assert err.value.field == "job.grad_clip"


@pytest.mark.parametrize("name", ["distributed_optimizer", "zero", "overlap_grad_reduce", "overlap_param_gather",
                                  "sequence_parallel", "megatron_step"])
def test_boolean_knobs_refuse_other_values(name):
    with pytest.raises(ScenarioError) as err:
        job(**{name: "yes"})
    assert err.value.field == f"job.{name}"


def test_tied_embeddings_exchange_gradients_between_the_first_and_last_stage():
    tied = DEBUG.with_(tied_embeddings=True)
    lay = Layout.from_degrees(16, tp=2, pp=4, dp=2, gpus_per_server=4)
    prog = build_program(job(tied, lay))
    nbytes = V * H // 2 * 4  # the vocab-parallel shard's gradient, fp32
    for s in range(4):
        embd = [op for op in prog.stages[s] if op.label == "embedding grads"]
        if s in (0, 3):
            offset = 3 if s == 0 else -3
            assert embd == [SendOp(offset, nbytes, "embedding grads", phase="embd"), RecvOp(offset, "embedding grads")]
            assert embd[0].megatron == "_allreduce_word_embedding_grads"
        else:
            assert embd == []
    # the last stage's copy of the output layer is in its data-parallel bytes
    assert job(tied, lay).stage_params(3)[0] == (LAYER + H + V * H) // 2  # one layer per stage
    assert not any(op.label == "embedding grads" for ops in build_program(job(tied, Layout.from_degrees(
        8, tp=2, dp=4, gpus_per_server=4))).stages for op in ops)


def test_moe_models_reduce_the_expert_grad_norm_over_their_own_group():
    moe = DEBUG.with_(experts=4, top_k=2)
    prog = build_program(job(moe, Layout.from_degrees(16, tp=2, ep=2, pp=2, dp=2, gpus_per_server=4)))
    norms = [op.group_dims for op in prog.stages[0] if getattr(op, "megatron", "") == "get_grad_norm_fp32"]
    assert norms == [TP_PP, (Dim.TP, Dim.EP, Dim.PP)]


def test_megatron_step_off_keeps_the_buckets_alone():
    prog = build_program(job(megatron_step=False, dp_buckets=2))
    for s in (0, 1):
        comm = [op for op in prog.stages[s][-6:] if isinstance(op, CollectiveOp) and op.dim is not Dim.TP]
        assert [(op.label, op.asynchronous) for op in comm] == [("dp bucket 0", True), ("dp bucket 1", True)]


def test_op_counts_by_dimension_and_megatron_name():
    counts = build_program(job()).op_counts()
    m = 2  # micro-batches; 4 tp all-reduces (2 per layer) per forward and per backward on each of the two stages
    assert counts["by_dim"] == {"tp": 2 * m * 2 * 4, "pp": 2 * m, "dp": 2 + 1, "tp+pp": 2 * 3}
    assert counts["by_name"]["get_grad_norm_fp32"] == 2
    assert counts["by_name"]["start_grad_sync"] == 2
    assert counts["by_name"]["train_step.loss_reduced"] == 1
    assert counts["by_name"]["send_forward"] == counts["by_name"]["send_backward"] == m


# -- the planner --------------------------------------------------------------------------------------------


def test_the_model_parallel_all_reduce_is_a_phase_of_its_own_where_it_crosses_servers():
    j = job()  # stage 0 on server 0 (its dp pair inside it), stage 1 on server 1
    prog = build_program(j, defer_dp=True)
    planner = OpusPlanner(j.layout, LIGHTRAIL)
    plan = planner.plan(prog)
    assert set(plan.phases) == {"pp", "tp+pp"}  # dp stays inside the servers
    norm = next(op for op in prog.stages[0] if getattr(op, "megatron", "") == "get_grad_norm_fp32")
    assert phase_key(norm) == "tp+pp"
    # the ring over (tp, pp) ranks [0, 1, 4, 5] (and [2, 3, 6, 7]): each stage needs the circuits of what its own
    # ranks send across servers, 1 -> 4 and 3 -> 6 (stage 0), 5 -> 0 and 7 -> 2 (stage 1, wrapping round), on the
    # receivers' rails 0 and 2
    for stage, (tx, rx) in ((0, (0, 1)), (1, (1, 0))):
        (req,) = planner.requirements(norm, stage)
        assert req.phase == "tp+pp"
        rail, txs, rxs = req.circuits
        assert sorted(zip(rail.tolist(), txs.tolist(), rxs.tolist(), strict=True)) == [(0, tx, rx), (2, tx, rx)]
    # the configuration on rail 0: server 0 -> 1 and, wrapping round, 1 -> 0
    assert plan.configurations["tp+pp"][0].tolist() == [1, 0]
    # the photonic iteration still equals the ideal one at zero delay and zero controller latency
    fabric = RailFabric(kind="photonic", ocs_delay=0.0, check_in_rtt=0.0, command_latency=0.0, revoke_rtt=0.0)
    photonic = simulate_iteration(prog, fabric, LIGHTRAIL).iteration_time_s
    assert photonic == pytest.approx(simulate_iteration(prog, replace(fabric, kind="ideal"), LIGHTRAIL)
                                     .iteration_time_s, rel=1e-12)


def test_no_circuits_when_tp_x_pp_fits_one_server():
    j = job(layout=Layout.from_degrees(8, tp=2, pp=2, dp=2, gpus_per_server=8))
    prog = build_program(j)
    planner = OpusPlanner(j.layout, LIGHTRAIL)
    norm = next(op for op in prog.stages[0] if getattr(op, "megatron", "") == "get_grad_norm_fp32")
    assert all(r.ncircuits == 0 for s in (0, 1) for r in planner.requirements(norm, s))
    assert "tp+pp" not in planner.plan(prog).phases


def test_the_embedding_exchange_is_a_phase_of_its_own():
    j = job(DEBUG.with_(tied_embeddings=True), Layout.from_degrees(16, tp=2, pp=4, dp=2, gpus_per_server=4))
    prog = build_program(j, defer_dp=True)
    plan = OpusPlanner(j.layout, LIGHTRAIL).plan(prog)
    assert "embd" in plan.phases
    fabric = RailFabric(kind="photonic", ocs_delay=10e-3)
    assert simulate_iteration(prog, fabric, LIGHTRAIL).iteration_time_s > 0


# -- the examples -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_simulates_electrical_and_photonic(path):
    scenario, base = load_scenario(path)
    try:
        built = scenario.build(base)
    except LightrailError as e:  # pragma: no cover - an example that does not build is a failure of its own
        pytest.fail(f"{path.name}: {e}")
    if built.job is None:
        pytest.skip("a trace scenario: no program")
    if built.job.layout.world > 4096:
        pytest.skip("too large for a unit test (test_examples.py covers it)")
    program = build_program(built.job, defer_dp=built.params.defer_dp)
    assert program.op_counts()["by_name"]["get_grad_norm_fp32"] >= 1 or built.job.layout.tp * built.job.layout.pp == 1
    for kind in ("electrical", "photonic"):
        r = simulate_iteration(program, replace(built.fabric, kind=kind), built.params)
        assert r.iteration_time_s > 0
