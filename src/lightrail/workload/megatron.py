"""Megatron-LM's step after the last backward, op for op: what ``finalize_model_grads``, the optimizer step and
``train_step`` put on the wire, each op named by the function that issues it.

Read from Megatron-LM's source (github.com/NVIDIA/Megatron-LM, main of August 2026); file and function are cited
beside each op. In the order a rank runs them:

1. ``finalize_model_grads`` (megatron/core/distributed/finalize_model_grads.py):
   - ``finish_grad_sync`` -> ``start_grad_sync`` (megatron/core/distributed/param_and_grad_buffer.py): the
     data-parallel gradient reduction, all-reduce or, with the distributed optimizer, reduce-scatter; with
     ``overlap_grad_reduce`` the buckets were launched during the last backward and this waits for them, else
     one bucket per buffer is reduced now;
   - ``_allreduce_non_tensor_model_parallel_grads`` (alias ``_allreduce_layernorm_grads``): with sequence
     parallelism, the LayerNorm and router gradients (replicated over tp) all-reduced over tp;
   - ``_allreduce_word_embedding_grads``: with tied embeddings and pipeline parallelism, the word-embedding
     gradient all-reduced in the embedding group, the first and the last pipeline stage;
   - no num-tokens all-reduce: it runs only with ``calculate_per_token_loss`` (off by default; schedules.py
     passes ``num_tokens`` None otherwise), and no position-embedding one (its group is the first stage alone).
2. ``ChainedOptimizer.step`` (megatron/core/optimizer/optimizer.py; ``get_megatron_optimizer`` always returns
   one): ``get_grad_norm`` -> ``get_grad_norm_fp32`` (megatron/core/optimizer/clip_grads.py) all-reduces the
   squared norm, one fp32, over the optimizer's ``grad_stats_parallel_group``: the model-parallel group (tp x pp)
   for dense weights and tp x ep x pp for experts (two groups, so two all-reduces, ``grads_states_parallel_group
   _is_shared`` being false), or with the distributed optimizer the whole world (``intra_dist_opt_group``, one
   all-reduce). It runs whatever ``--clip-grad`` is: clipping itself only scales gradients in place. bf16 has no
   loss scaler, so no found-inf all-reduce. Then ``DistributedOptimizer.step_with_ready_grads``
   (megatron/core/optimizer/distrib_optimizer.py) all-gathers the parameters (``start_param_sync``), unless
   ``overlap_param_gather`` leaves that to the next forward's pre-hooks.
3. ``train_step`` (megatron/training/training.py): ``logical_and_across_model_parallel_group`` (update
   successful, one int32) and ``reduce_max_stat_across_model_parallel_group`` (the grad norm, one fp32), both on
   the model-parallel group; then on the last stage the loss, ``[sum of losses, tokens]`` in fp32, all-reduced over
   the data-parallel group with context parallelism (what ``average_losses_across_data_parallel_group`` did).

Groups are named by lightrail's dimensions: Megatron's data-parallel group of dense weights is cp x ep x dp here
(its dp counts the expert-parallel ranks), its model-parallel group tp x pp. A collective whose group spans
pipeline stages is in every member stage's op list; the planner gives each stage its own ranks' transfers.
"""

from __future__ import annotations

from math import prod

from lightrail.collectives.collective import Kind
from lightrail.workload.parallel import ORDER, Dim
from lightrail.workload.program import CollectiveOp, ComputeOp, ProgramOp, RecvOp, SendOp, TrainingJob

__all__ = ["GRAD_NORM_BYTES", "FLAG_BYTES", "LOSS_BYTES", "MODEL_PARALLEL", "param_gather_behind_forward",
           "last_backward", "step", "gradient_sync_alone"]

GRAD_NORM_BYTES = 4
"""One fp32: the squared gradient norm (clip_grads.py ``get_grad_norm_fp32``) or the norm's max (training.py)."""
FLAG_BYTES = 4
"""One int32: ``update_successful`` (``logical_and_across_model_parallel_group``)."""
LOSS_BYTES = 8
"""``[sum of masked losses, tokens]`` in fp32: pretrain_gpt.py ``loss_func`` reports both for 'lm loss'."""
MODEL_PARALLEL = (Dim.TP, Dim.PP)
"""Megatron's model-parallel group (parallel_state.py ``_MODEL_PARALLEL_GROUP``, ranks 'tp-pp')."""
_REPLICAS = {"dense": (Dim.CP, Dim.EP, Dim.DP), "experts": (Dim.CP, Dim.DP)}
"""Data-parallel groups of each gradient buffer: dense weights are replicated over cp, ep and dp; each ep rank
owns its experts (Megatron's ``expert_parallel_buffers``)."""


def _size(job: TrainingJob, dims) -> int:
    return prod(job.layout.degree(d) for d in dims)


def _buffers(job: TrainingJob, stage: int) -> list[tuple[tuple[Dim, ...], int, str]]:
    """(data-parallel group, parameters, tag) of each gradient buffer of the stage that has replicas."""
    dense, expert = job.stage_params(stage)
    return [(_REPLICAS[tag], params, tag) for params, tag in ((dense, "dense"), (expert, "experts"))
            if params and _size(job, _REPLICAS[tag]) > 1]


def _buckets(job: TrainingJob) -> int:
    # distributed_data_parallel.py DistributedDataParallel.__init__: without overlap_grad_reduce, bucket_size is
    # None, one bucket per buffer.
    return job.dp_buckets if job.overlap_grad_reduce else 1


def _param_gathers(job: TrainingJob, stage: int, *, asynchronous: bool) -> list[ProgramOp]:
    """The distributed optimizer's parameter all-gather, one per bucket of each buffer (bf16 parameters):
    distributed_data_parallel.py ``start_param_sync``."""
    b, buffers = _buckets(job), _buffers(job, stage)
    return [CollectiveOp(Dim.DP, Kind.ALLGATHER, params * job.model.dtype_bytes / b,
                         f"dp allgather {k}" + (f" {tag}" if len(buffers) > 1 else ""), asynchronous=asynchronous,
                         span=span, megatron="start_param_sync")
            for k in range(b) for span, params, tag in buffers]


def param_gather_behind_forward(job: TrainingJob, stage: int) -> list[ProgramOp]:
    """With ``overlap_param_gather``, the previous step's parameter all-gathers at the start of the iteration,
    asynchronous: optimizer.zero_grad dispatches the first and the forward pre-hooks the next ones, one at a
    time, behind the forward (distributed_data_parallel.py ``_make_forward_pre_hook``)."""
    if not job.overlap_param_gather:
        return []
    return _param_gathers(job, stage, asynchronous=True)


def _is_dp_bucket(op: ProgramOp) -> bool:
    return isinstance(op, CollectiveOp) and op.megatron == "start_grad_sync"


def last_backward(job: TrainingJob, stage: int, chunk: list[ProgramOp], *, defer_dp: bool = False) -> list[ProgramOp]:
    """The stage's last backward with the data-parallel gradient reduction (param_and_grad_buffer.py
    ``_ParamAndGradBucketGroup.start_grad_sync``), and ``finalize_model_grads``'s ``finish_grad_sync``.

    With ``overlap_grad_reduce``, the backward's compute is split in ``dp_buckets`` parts, bucket k launched
    (asynchronous) after part k, as the backward hooks launch a bucket once its gradients are ready; the last
    bucket is launched synchronously after the backward's sends, as ``finish_grad_sync`` waits for it (and so for
    the buckets before it on the same communicator). Without, one bucket per buffer after the backward.
    ``defer_dp`` moves the asynchronous buckets after the stage's last pipeline send (a photonic-rails policy)."""
    buffers = _buffers(job, stage)
    if not buffers:
        return chunk
    kind = Kind.REDUCESCATTER if job.distributed_optimizer else Kind.ALLREDUCE
    b = _buckets(job)

    def bucket(k: int, span, params: int, tag: str, *, asynchronous: bool) -> CollectiveOp:
        name = f"dp bucket {k}" + (f" {tag}" if len(buffers) > 1 else "")
        return CollectiveOp(Dim.DP, kind, params * job.grad_bytes / b, name, asynchronous=asynchronous, span=span,
                            megatron="start_grad_sync")

    ops = _split_backward(chunk, b, lambda k: [bucket(k, span, params, tag, asynchronous=True)
                                               for span, params, tag in buffers] if k < b - 1 else [],
                          defer_dp=defer_dp)
    return ops + [bucket(b - 1, span, params, tag, asynchronous=False) for span, params, tag in buffers]


def _split_backward(chunk: list[ProgramOp], parts: int, after, *, defer_dp: bool) -> list[ProgramOp]:
    """``chunk`` with its (first) compute split in ``parts`` equal parts, the ops ``after(k)`` following part k,
    as the backward hooks launch a bucket once its gradients are ready; with ``defer_dp`` the gradient buckets
    move after the chunk's other ops (its pipeline sends)."""
    compute = next(op for op in chunk if isinstance(op, ComputeOp))
    ops: list[ProgramOp] = []
    for op in chunk:
        if op is not compute:
            ops.append(op)
            continue
        for k in range(parts):
            ops.append(ComputeOp(compute.seconds / parts, f"{compute.label}.{k}" if parts > 1 else compute.label))
            ops += after(k)
    if defer_dp:
        ops = [op for op in ops if not _is_dp_bucket(op)] + [op for op in ops if _is_dp_bucket(op)]
    return ops


def step(job: TrainingJob, stage: int) -> list[ProgramOp]:
    """The rest of ``finalize_model_grads``, the optimizer step and ``train_step``'s reductions on a stage, in
    the order Megatron issues them (see the module docstring)."""
    m, lay = job.model, job.layout
    last = lay.pp - 1
    ops: list[ProgramOp] = []
    if job.sequence_parallel and lay.tp > 1:
        # finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads: parameters marked sequence_parallel
        # (LayerNorm weights, the MoE router: router.py Router.reset_parameters) all-reduced over tp, coalesced.
        ops.append(CollectiveOp(Dim.TP, Kind.ALLREDUCE, job.stage_norm_params(stage) * job.grad_bytes,
                                "layernorm grads", megatron="_allreduce_non_tensor_model_parallel_grads"))
    if m.tied_embeddings and lay.pp > 1 and stage in (0, last):
        # finalize_model_grads.py _allreduce_word_embedding_grads: all_reduce(grad, group=embd_group), the group
        # of the first and last stage (parallel_state.py default_embedding_ranks). Two members: an exchange of the
        # vocab-parallel shard's gradient, each side adding the other's (a ring all-reduce of 2 moves as much).
        offset = last if stage == 0 else -last
        nbytes = m.vocab * m.hidden // lay.tp * job.grad_bytes
        ops += [SendOp(offset, nbytes, "embedding grads", phase="embd", megatron="_allreduce_word_embedding_grads"),
                RecvOp(offset, "embedding grads")]
    # optimizer.py ChainedOptimizer.step -> get_grad_norm -> clip_grads.py get_grad_norm_fp32
    if job.distributed_optimizer:
        norms = [(ORDER, "grad norm")]  # optimizer/__init__.py: grad_stats_parallel_group = intra_dist_opt_group
    else:
        norms = [(MODEL_PARALLEL, "grad norm")] + ([((Dim.TP, Dim.EP, Dim.PP), "grad norm experts")]
                                                   if m.experts else [])
    ops += [CollectiveOp(Dim.PP, Kind.ALLREDUCE, GRAD_NORM_BYTES, label, span=dims, megatron="get_grad_norm_fp32")
            for dims, label in norms if _size(job, dims) > 1]
    if job.distributed_optimizer and not job.overlap_param_gather:
        # distrib_optimizer.py DistributedOptimizer.step_with_ready_grads: synchronous start_param_sync
        ops += _param_gathers(job, stage, asynchronous=False)
    if _size(job, MODEL_PARALLEL) > 1:
        # training.py train_step: update_successful and grad_norm across mp_group (common_utils.py)
        ops += [CollectiveOp(Dim.PP, Kind.ALLREDUCE, FLAG_BYTES, "update successful", span=MODEL_PARALLEL,
                             megatron="logical_and_across_model_parallel_group"),
                CollectiveOp(Dim.PP, Kind.ALLREDUCE, GRAD_NORM_BYTES, "grad norm max", span=MODEL_PARALLEL,
                             megatron="reduce_max_stat_across_model_parallel_group")]
    if stage == last and _size(job, _REPLICAS["dense"]) > 1:
        # training.py train_step: on the last stage, all_reduce(val, group=dp_cp_group) of each loss key
        ops.append(CollectiveOp(Dim.DP, Kind.ALLREDUCE, LOSS_BYTES, "loss", span=_REPLICAS["dense"],
                                megatron="train_step.loss_reduced"))
    return ops


def gradient_sync_alone(job: TrainingJob, stage: int, chunk: list[ProgramOp], *,
                        defer_dp: bool = False) -> list[ProgramOp]:
    """The last backward of lightrail's program before the step was modelled (``megatron_step: false``):
    ``dp_buckets`` asynchronous buckets during it (after its sends with ``defer_dp``), and with the distributed
    optimizer one synchronous parameter all-gather per buffer at the end."""
    buffers = _buffers(job, stage)
    if not buffers:
        return chunk
    b = job.dp_buckets
    kind = Kind.REDUCESCATTER if job.distributed_optimizer else Kind.ALLREDUCE
    ops = _split_backward(chunk, b, lambda k: [
        CollectiveOp(Dim.DP, kind, params * job.grad_bytes / b, f"dp bucket {k}" + (f" {tag}" if len(buffers) > 1
                     else ""), asynchronous=True, span=span, megatron="start_grad_sync")
        for span, params, tag in buffers], defer_dp=defer_dp)
    if job.distributed_optimizer:
        ops += [CollectiveOp(Dim.DP, Kind.ALLGATHER, params * job.model.dtype_bytes, f"dp allgather {tag}", span=span,
                             megatron="start_param_sync") for span, params, tag in buffers]
    return ops
