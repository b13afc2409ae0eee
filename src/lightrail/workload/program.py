"""One training iteration as a Program: per pipeline stage, the ordered ops every rank of it runs.

Built in named passes (torchtitan's habit): the job is checked, per-micro-batch costs are
derived from the model (FLOPs through a roofline, bytes per collective), then the 1F1B order
of each stage is laid out, and Megatron-LM's step closes the iteration (:mod:`lightrail.workload.megatron`):
the data-parallel gradient sync, the rest of ``finalize_model_grads``, the optimizer step and the loss.

All ranks of a pipeline stage run the same op sequence (they differ only in which group of each
dimension they belong to), so a Program stores one op list per stage; ``ops_for_rank`` gives a
rank its own list. Communication ops name their dimension, which is how planners know the phase.

Bytes per op (Megatron-LM conventions, bf16 unless the model says otherwise):
- tp: two all-reduces of the micro-batch activations per layer forward, two backward;
- cp: ring attention passes K and V around the cp ring (all-gather forward, reduce-scatter of
  their gradients backward), per layer;
- ep: dispatch and combine all-to-alls of the routed tokens per MoE layer, both ways;
- pp: each rank sends its 1/tp share of the stage-boundary activation (scatter-gather), and the
  same for the gradient backward;
- dp: the stage's gradients (its parameters / tp), all-reduced or, with the distributed optimizer,
  reduce-scattered, the parameters all-gathered after the step; with ``overlap_grad_reduce`` split into
  ``dp_buckets`` buckets launched as the last backward proceeds, else one bucket after it (Megatron's default).
  Dense gradients are reduced over all their replicas (cp x ep x dp), expert gradients over cp x dp.

Every communication op carries the name of the Megatron-LM function that issues it (``megatron``), which
``Program.op_counts`` counts by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import ClassVar, Protocol

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import AUTO, parse_kind
from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.workload.hardware import GPU, compute_seconds
from lightrail.workload.model import ModelSpec
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.pipeline import PipelineSchedule, pipeline_order

__all__ = ["stage_layer_counts", "ComputeOp", "CollectiveOp", "SendOp", "RecvOp", "ProgramOp", "CommOp",
           "PipelineSchedule", "TrainingJob", "Program", "build_program", "MFU", "SCENARIO_DP_BUCKETS"]

MFU = 0.4
"""Model FLOPs utilisation assumed when a job gives none: large dense training runs report 0.3-0.5."""
SCENARIO_DP_BUCKETS = 4
"""Gradient buckets of a scenario file that gives none, used with ``overlap_grad_reduce`` (as DDP and Megatron
buckets overlap the last backward). A bare :class:`TrainingJob` keeps one bucket, the plainest program (one sync
per replica group), whose op counts the workload tests pin."""


@dataclass(frozen=True)
class ComputeOp:
    seconds: float
    label: str


@dataclass(frozen=True)
class CollectiveOp:
    """``count`` back-to-back collectives of ``kind`` on the rank's ``dim`` group, ``nbytes`` each.

    An ``asynchronous`` collective is issued and left running while the rank goes on (gradient
    buckets overlapping the backward); the iteration ends when it completes.
    """

    dim: Dim
    kind: Kind
    """The collective; a string is read as its Kind (``"allreduce"``)."""
    nbytes: float
    label: str
    count: int = 1
    asynchronous: bool = False
    span: tuple[Dim, ...] = ()
    """Dimensions the group spans (default: just ``dim``); gradients of dense weights are reduced
    over every replica (cp, ep and dp), those of experts over cp and dp."""
    algorithm: str = AUTO
    """A registered algorithm of ``kind`` (``lightrail algorithms``), or ``"auto"``: the registry's choice
    (``collectives.registry.resolve``)."""
    megatron: str = field(default="", compare=False)
    """The Megatron-LM function that issues it (``start_grad_sync``, ``get_grad_norm_fp32``, ...)."""

    def __post_init__(self):
        object.__setattr__(self, "kind", parse_kind(self.kind))

    @property
    def group_dims(self) -> tuple[Dim, ...]:
        return self.span or (self.dim,)


@dataclass(frozen=True)
class SendOp:
    """Pipeline send to the stage ``offset`` away (+1 next, -1 previous)."""

    offset: int
    nbytes: float
    label: str
    dim: Dim = Dim.PP
    phase: str = ""
    """The plan's phase when it is not the dimension's: ``"embd"`` for the exchange between the first and the
    last stage that all-reduces tied word-embedding gradients (Megatron's embedding group)."""
    megatron: str = field(default="", compare=False)
    """The Megatron-LM function that issues it (``send_forward``, ``send_backward``, ...)."""
    count: ClassVar[int] = 1
    asynchronous: ClassVar[bool] = False

    @property
    def group_dims(self) -> tuple[Dim, ...]:
        return (self.dim,)


@dataclass(frozen=True)
class RecvOp:
    """Pipeline receive from the stage ``offset`` away; it waits for that stage's matching send."""

    offset: int
    label: str
    dim: Dim = Dim.PP


ProgramOp = ComputeOp | CollectiveOp | SendOp | RecvOp
"""One op of a program; executors ``match`` on the four classes."""


class CommOp(Protocol):
    """What planners and simulators read of an op that moves data over a group (CollectiveOp, SendOp)."""

    @property
    def dim(self) -> Dim: ...
    @property
    def group_dims(self) -> tuple[Dim, ...]: ...
    @property
    def nbytes(self) -> float: ...
    @property
    def label(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def asynchronous(self) -> bool: ...


def stage_layer_counts(layers: int, pp: int, rule: str | tuple[int, ...] | list[int] = "even") -> list[int]:
    """Layers of each of ``pp`` pipeline stages by ``rule`` (see ``TrainingJob.pipeline_layers``).

    >>> stage_layer_counts(126, 16, "balanced")[:2], stage_layer_counts(126, 16, "balanced")[-2:]
    ([7, 8], [8, 7])
    >>> stage_layer_counts(10, 4, "balanced")
    [2, 3, 3, 2]
    """
    if isinstance(rule, str):
        if rule == "even":
            if layers % pp:
                raise InfeasibleError(f"{layers} layers do not split into pp={pp} stages", field="parallel.pp",
                                      fix="choose pp dividing the layer count, or set job.pipeline_layers: balanced")
            return [layers // pp] * pp
        if rule == "balanced":
            per = -(-layers // pp)
            counts = [per] * pp
            order = [i for k in range((pp + 1) // 2) for i in dict.fromkeys((k, pp - 1 - k))]
            for i in order[: per * pp - layers]:
                counts[i] -= 1
            if min(counts) < 1:
                raise InfeasibleError(f"{layers} layers cannot fill pp={pp} stages", field="parallel.pp",
                                      fix="use fewer pipeline stages than layers")
            return counts
        raise InfeasibleError(f"unknown rule {rule!r}", field="job.pipeline_layers",
                              fix="even, balanced, or a list of layers per stage")
    counts = [int(c) for c in rule]
    if len(counts) != pp or min(counts, default=0) < 1 or sum(counts) != layers or any(
            isinstance(c, bool) or int(c) != c for c in rule):
        raise InfeasibleError(f"{list(rule)} is not {pp} stage sizes >= 1 summing to {layers} layers",
                              field="job.pipeline_layers", fix="one count per pipeline stage, summing to the layers")
    return counts


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """A model trained with a parallel layout on a kind of GPU; checked on construction."""

    model: ModelSpec
    layout: Layout
    gpu: GPU
    micro_batches: int
    """Micro-batches per pipeline per iteration (global batch = micro_batches * micro_batch_size * dp * ep)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch."""
    mfu: float = MFU
    """Achieved fraction of peak FLOP/s for compute (roofline)."""
    distributed_optimizer: bool | None = None
    """Megatron's distributed optimizer (ZeRO-1; ``--use-distributed-optimizer``, off by default): gradients are
    reduce-scattered instead of all-reduced, each rank steps its shard, and the parameters are all-gathered after
    the step. None: as ``zero`` says, else off."""
    zero: bool | None = None
    """The old spelling of ``distributed_optimizer``, still read; giving both with different values is an error.
    Both hold the same value once the job is built."""
    overlap_grad_reduce: bool = False
    """Megatron's ``--overlap-grad-reduce`` (off by default): gradient buckets are launched as the last backward
    proceeds and ``finalize_model_grads`` waits for them; off, the gradients are one bucket per buffer
    (``DistributedDataParallel`` sets ``bucket_size`` None) reduced after the last backward."""
    overlap_param_gather: bool = False
    """Megatron's ``--overlap-param-gather`` (off by default; needs the distributed optimizer and
    ``overlap_grad_reduce``): the parameter all-gathers run behind the next forward instead of after the step."""
    sequence_parallel: bool = False
    """Megatron's ``--sequence-parallel`` (off by default; without tensor parallelism Megatron turns it off):
    tensor-parallel all-reduces become all-gather + reduce-scatter, and the replicated LayerNorm and router
    gradients are all-reduced over tp in ``finalize_model_grads``."""
    grad_clip: float = 1.0
    """Megatron's ``--clip-grad`` (1.0 by default; 0 turns clipping off). Clipping scales the gradients where they
    are by the global norm, which Megatron's ChainedOptimizer reduces every step whatever this says (for the
    log), so it adds no collective: the grad-norm all-reduce is in the program either way."""
    megatron_step: bool = True
    """Megatron's step after the last backward as Megatron issues it (:mod:`lightrail.workload.megatron`). False:
    lightrail's program before it modelled the step (issue 29), for comparisons and for tests about other things:
    ``dp_buckets`` asynchronous buckets during the last backward whatever ``overlap_grad_reduce`` says, and with
    the distributed optimizer one parameter all-gather per buffer at the end; no other collective."""
    dp_buckets: int = 1
    """Gradient buckets with ``overlap_grad_reduce``; bucket k is launched when k/buckets of the last backward is
    done (a scenario file's default is :data:`SCENARIO_DP_BUCKETS`). Without overlap Megatron makes one bucket
    per buffer, and this is not used."""
    grad_bytes: int = 4
    """Bytes per gradient element in the gradient reductions: 4, as Megatron-LM reduces them with bf16 training
    (megatron/training/arguments.py ``validate_args``: with ``--bf16``, gradients are accumulated and all-reduced
    in fp32, ``accumulate_allreduce_grads_in_fp32``, unless ``--grad-reduce-in-bf16``: then 2)."""
    schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    """Pipeline schedule; a string (``"1f1b"``, ``"gpipe"``, ``"interleaved"``) is read as a PipelineSchedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline stage with ``schedule: interleaved`` (Megatron's
    ``virtual_pipeline_model_parallel_size``, from ``--num-layers-per-virtual-pipeline-stage``): 2 or more, each
    chunk layers/(pp * virtual_stages) layers; stage s holds virtual stages s, s + pp, s + 2 pp, ... Other
    schedules take 1."""
    moe_dispatch: str = "payload"
    """EP all-to-all style (MoE models): ``payload`` sends routed tokens only, ``padded`` sends every expert's
    ``capacity`` slots, full or not (GShard); bytes from :mod:`lightrail.workload.moe_bytes`, as the MoE layer
    sends."""
    capacity_factor: float = 1.25
    """Slots per expert over the uniform share, for ``moe_dispatch: padded``."""
    moe_imbalance: float = 1.0
    """Max over mean tokens per destination rank (>= 1; ``lightrail moe bench`` reports the layer's): a payload
    all-to-all finishes with its most loaded rank, so its chunks are scaled by this."""
    pipeline_layers: str | tuple[int, ...] = "even"
    """Layers per pipeline stage: ``even`` (pp must divide the layer count), ``balanced`` (Llama 3's recipe for
    405B on 16 stages, sec. 3.3.2 of its report: one layer fewer on the first and last stages, which also hold the
    embedding and the output layer, then on the next ones inwards, until the layers fit), or one count per stage."""

    def __post_init__(self):
        self._check_megatron_knobs()
        m, lay = self.model, self.layout
        if isinstance(self.pipeline_layers, list):
            object.__setattr__(self, "pipeline_layers", tuple(self.pipeline_layers))
        self._check_virtual_stages()
        counts = stage_layer_counts(m.layers, lay.pp, self.pipeline_layers)
        object.__setattr__(self, "_stage_starts", (0, *accumulate(counts)))
        checks = [
            (m.heads % lay.tp == 0, "parallel.tp", f"{m.heads} heads do not split over tp={lay.tp}",
             "choose tp dividing the head count"),
            (m.kv_heads % lay.tp == 0, "parallel.tp", f"{m.kv_heads} key-value heads do not split over tp={lay.tp}",
             "choose tp dividing the key-value head count (Megatron's query groups)"),
            (lay.ep == 1 or m.experts > 0, "parallel.ep", f"ep={lay.ep} needs a mixture-of-experts model",
             "set ep to 1 or pick an MoE model"),
            (lay.ep == 1 or m.experts % lay.ep == 0, "parallel.ep",
             f"{m.experts} experts do not split over ep={lay.ep}", "choose ep dividing the expert count"),
            (m.seq_len % lay.cp == 0, "parallel.cp", f"sequence length {m.seq_len} does not split over cp={lay.cp}",
             "choose cp dividing the sequence length"),
            (self.micro_batches >= 1, "job.micro_batches", f"{self.micro_batches} micro-batches", "use 1 or more"),
            (self.micro_batch_size >= 1, "job.micro_batch_size", f"{self.micro_batch_size}", "use 1 or more"),
            (self.dp_buckets >= 1, "job.dp_buckets", f"{self.dp_buckets} buckets", "use 1 or more"),
            (0 < self.mfu <= 1, "job.mfu", f"mfu={self.mfu}", f"use a fraction in (0, 1], e.g. {MFU}"),
            (self.schedule in list(PipelineSchedule), "job.schedule", f"unknown schedule {self.schedule!r}",
             "use 1f1b, gpipe or interleaved"),
        ]
        if self.moe_dispatch not in ("payload", "padded"):
            raise InfeasibleError(f"unknown dispatch style {self.moe_dispatch!r}", field="job.moe_dispatch",
                                  fix="use payload or padded")
        for name, low in (("capacity_factor", 0.0), ("moe_imbalance", 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    value > low if name == "capacity_factor" else value >= low):
                raise InfeasibleError(f"{value!r} is not a number {'>' if low == 0 else '>='} {low:g}",
                                      field=f"job.{name}", fix="e.g. 1.25" if low == 0 else "use 1 for uniform routing")
        for name in ("micro_batches", "micro_batch_size", "dp_buckets", "grad_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InfeasibleError(f"{value!r} is not a whole number", field=f"job.{name}", fix="use an integer")
        if isinstance(self.mfu, bool) or not isinstance(self.mfu, (int, float)):
            raise InfeasibleError(f"{self.mfu!r} is not a fraction", field="job.mfu", fix=f"use e.g. {MFU}")
        for ok, fld, message, fix in checks:
            if not ok:
                raise InfeasibleError(message, field=fld, fix=fix)
        object.__setattr__(self, "schedule", PipelineSchedule(self.schedule))

    def _check_virtual_stages(self) -> None:
        """``virtual_stages`` and what Megatron asks of an interleaved job: at least two chunks (Megatron runs one
        as plain 1F1B: arguments.py sets ``virtual_pipeline_model_parallel_size`` None), layers dividing into
        pp x virtual_stages chunks (``validate_args``), and micro-batches a multiple of pp (a last micro-batch
        group shorter than pp is refused by ``forward_backward_pipelining_with_interleaving``; lightrail keeps
        Megatron's group size, pp, and asks for whole groups)."""
        v, lay = self.virtual_stages, self.layout
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScenarioError(f"{v!r} is not a whole number >= 1", field="job.virtual_stages",
                                fix="use 2 or more with schedule: interleaved, else 1")
        if self.schedule != PipelineSchedule.INTERLEAVED:
            if v != 1:
                raise ScenarioError(f"virtual_stages={v} needs schedule: interleaved (schedule is {self.schedule})",
                                    field="job.virtual_stages", fix="set schedule: interleaved, or drop virtual_stages")
            return
        if v < 2:
            raise ScenarioError(f"the interleaved schedule needs 2 or more virtual stages, not {v} (Megatron runs "
                                "one chunk per stage as plain 1F1B)", field="job.virtual_stages",
                                fix="use 2 or more, or schedule: 1f1b")
        if lay.pp < 2:
            raise ScenarioError("the interleaved schedule needs pipeline parallelism (pp >= 2)", field="job.schedule",
                                fix="use 1f1b, or pp >= 2")
        if self.model.layers % (lay.pp * v):
            raise ScenarioError(f"{self.model.layers} layers do not split into pp x virtual_stages = {lay.pp} x {v} "
                                "chunks", field="job.virtual_stages",
                                fix="choose virtual_stages so that pp x virtual_stages divides the layer count")
        if self.pipeline_layers != "even":
            raise ScenarioError(f"pipeline_layers {self.pipeline_layers!r} with the interleaved schedule: its chunks "
                                "are even", field="job.pipeline_layers", fix="use even")
        if isinstance(self.micro_batches, int) and self.micro_batches % lay.pp:
            raise ScenarioError(f"{self.micro_batches} micro-batches is not a multiple of pp={lay.pp}, as Megatron's "
                                "interleaved schedule requires", field="job.micro_batches",
                                fix=f"use a multiple of {lay.pp}")

    def _check_megatron_knobs(self) -> None:
        """Booleans and the clip value, ``zero`` read as the old spelling of ``distributed_optimizer``, and
        Megatron's own refusal of ``overlap_param_gather`` without the distributed optimizer and overlapped
        gradient reduction (``megatron/training/arguments.py``, ``validate_args``)."""
        for name in ("distributed_optimizer", "zero", "overlap_grad_reduce", "overlap_param_gather",
                     "sequence_parallel", "megatron_step"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or value is None and name in ("distributed_optimizer", "zero")):
                raise ScenarioError(f"{value!r} is not a boolean", field=f"job.{name}", fix="use true or false")
        new, old = self.distributed_optimizer, self.zero
        if new is not None and old is not None and new != old:
            raise ScenarioError(f"zero: {str(old).lower()} (the old spelling of distributed_optimizer) disagrees "
                                f"with distributed_optimizer: {str(new).lower()}", field="job.zero",
                                fix="give only distributed_optimizer")
        resolved = bool(new if new is not None else old)
        object.__setattr__(self, "distributed_optimizer", resolved)
        object.__setattr__(self, "zero", resolved)
        clip = self.grad_clip
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip >= 0 or clip == float("inf"):
            raise ScenarioError(f"{clip!r} is not a finite number >= 0", field="job.grad_clip",
                                fix="e.g. 1.0 (Megatron's --clip-grad), or 0 for no clipping")
        if self.overlap_param_gather and not (self.distributed_optimizer and self.overlap_grad_reduce):
            missing = "distributed_optimizer" if not self.distributed_optimizer else "overlap_grad_reduce"
            raise ScenarioError(f"overlap_param_gather needs {missing} (Megatron refuses it without)",
                                field="job.overlap_param_gather", fix=f"set {missing}: true, or drop it")

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank processes per micro-batch (its context-parallel share of the sequences)."""
        return self.micro_batch_size * self.model.seq_len // self.layout.cp

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens the job trains on per iteration: the global batch (micro_batches x micro_batch_size x dp x ep
        sequences) times the sequence length."""
        lay = self.layout
        return self.micro_batches * self.micro_batch_size * lay.dp * lay.ep * self.model.seq_len

    def stage_layers(self, stage: int) -> range | tuple[int, ...]:
        """Layers held by ``stage``: a range, or with virtual stages those of each of its chunks in turn."""
        if self.virtual_stages > 1:
            return tuple(i for c in range(self.virtual_stages) for i in self.chunk_layers(stage, c))
        return range(self._stage_starts[stage], self._stage_starts[stage + 1])

    def chunk_layers(self, stage: int, chunk: int) -> range:
        """Layers of model chunk ``chunk`` of ``stage``: virtual stage chunk x pp + stage of pp x virtual_stages
        (Megatron's interleaved layer assignment); the stage's layers without virtual stages."""
        if self.virtual_stages == 1:
            return range(self._stage_starts[stage], self._stage_starts[stage + 1])
        per = self.model.layers // (self.layout.pp * self.virtual_stages)
        first = (chunk * self.layout.pp + stage) * per
        return range(first, first + per)

    def stage_params(self, stage: int) -> tuple[int, int]:
        """(dense, expert) parameters of a stage held by one rank (tp-sharded, experts ep-sharded)."""
        m, lay = self.model, self.layout
        dense = expert = 0
        for i in self.stage_layers(stage):
            routed = m.expert_params(i)
            dense += m.layer_params(i) - routed
            expert += routed
        if stage == 0:
            dense += m.vocab * m.hidden
        if stage == lay.pp - 1:
            # Final norm and output layer; a tied output layer is the input embedding itself on one stage, and
            # its own copy on the last of several (Megatron's GPTModel: the copy's gradient is all-reduced with
            # the first stage's by _allreduce_word_embedding_grads).
            dense += m.hidden + (0 if m.tied_embeddings and lay.pp == 1 else m.vocab * m.hidden)
        return dense // lay.tp, expert // (lay.tp * lay.ep)

    def stage_norm_params(self, stage: int) -> int:
        """Weights of a stage that every tp rank holds whole: the norms of its layers (two each), the routers of
        its MoE layers, and the final norm on the last stage; what sequence parallelism all-reduces over tp
        (Megatron marks them ``sequence_parallel``)."""
        m = self.model
        norms = sum(2 * m.hidden + (m.hidden * m.experts if m.is_moe_layer(i) else 0) for i in self.stage_layers(stage))
        return norms + (m.hidden if stage == self.layout.pp - 1 else 0)


@dataclass(frozen=True)
class Program:
    """Per pipeline stage, the ops of one iteration; every rank of the stage runs that list."""

    job: TrainingJob
    stages: tuple[tuple[ProgramOp, ...], ...]
    notes: dict = field(default_factory=dict)

    def ops_for_rank(self, rank: int) -> tuple[ProgramOp, ...]:
        if not 0 <= rank < self.job.layout.world:
            raise InfeasibleError(f"rank {rank} is not in 0..{self.job.layout.world - 1}", field="rank")
        return self.stages[rank // (self.job.layout.world // self.job.layout.pp)]

    def count(self, kind: type) -> int:
        return sum(isinstance(op, kind) for ops in self.stages for op in ops)

    def op_counts(self) -> dict[str, dict[str, int]]:
        """Communication calls per iteration of one rank of each stage, summed over the stages (a collective's
        ``count`` expanded; a send and its receive are one call): ``by_dim``, keyed by the dimensions of the
        op's group with degree > 1 joined by ``+`` (``dp``, ``cp+dp``, ``tp+pp``), and ``by_name``, keyed by
        the Megatron-LM function that issues it.

        >>> from lightrail.workload import GPUS, preset
        >>> job = TrainingJob(model=preset("debug"), layout=Layout.from_degrees(8, tp=2, pp=2, gpus_per_server=4),
        ...                   gpu=GPUS["h100"], micro_batches=1)
        >>> build_program(job).op_counts()["by_dim"]
        {'tp': 16, 'pp': 2, 'dp': 3, 'tp+pp': 6}
        """
        lay = self.job.layout
        by_dim: dict[str, int] = {}
        by_name: dict[str, int] = {}
        for ops in self.stages:
            for op in ops:
                if not isinstance(op, (CollectiveOp, SendOp)):
                    continue
                dims = "+".join(d.value for d in op.group_dims if lay.degree(d) > 1) or op.dim.value
                name = op.megatron or op.label
                by_dim[dims] = by_dim.get(dims, 0) + op.count
                by_name[name] = by_name.get(name, 0) + op.count
        return {"by_dim": by_dim, "by_name": by_name}


def _stage_costs(job: TrainingJob, stage: int, chunk: int = 0) -> dict:
    """Seconds and bytes of one micro-batch on one rank of ``stage`` (pass 2), of model chunk ``chunk`` with
    virtual stages (its layers' share; the output layer's on the last virtual stage)."""
    m, lay = job.model, job.layout
    tokens = job.tokens_per_rank
    layers = job.chunk_layers(stage, chunk)
    flops = sum(m.layer_flops(i, tokens) for i in layers)
    if stage == lay.pp - 1 and chunk == job.virtual_stages - 1:
        flops += m.logits_flops(tokens)
    fwd = compute_seconds(flops / lay.tp, job.gpu, job.mfu)
    act = m.activation_bytes(tokens)
    moe = sum(m.is_moe_layer(i) for i in layers)
    return {
        "fwd": fwd,
        "bwd": fwd * m.backward_factor,
        "tp": (act, 2 * len(layers)),
        "cp": (m.kv_bytes(tokens) / lay.tp, len(layers)),
        "ep": (m.moe_alltoall_bytes(tokens, lay.ep, dispatch=job.moe_dispatch, capacity_factor=job.capacity_factor,
                                    imbalance=job.moe_imbalance) / lay.tp, 2 * moe),
        "pp": act / lay.tp,
    }


def _neighbours(job: TrainingJob, stage: int, chunk: int) -> tuple[int | None, int | None]:
    """Stage offsets of the previous and the next virtual stage of ``stage``'s ``chunk`` (None: there is none).
    Virtual stage c x pp + s follows c x pp + s - 1: the stage before, or, from stage 0, the last stage's previous
    chunk (offset pp - 1); the next is the stage after, or, from the last stage, stage 0's next chunk (offset
    -(pp - 1)). Without virtual stages: -1 and +1 inside the pipeline."""
    pp = job.layout.pp
    virtual, last = chunk * pp + stage, pp * job.virtual_stages - 1
    prev = None if virtual == 0 else (-1 if stage > 0 else pp - 1)
    nxt = None if virtual == last else (+1 if stage < pp - 1 else -(pp - 1))
    return prev, nxt


def _micro_batch_ops(job: TrainingJob, costs: dict, stage: int, j: int, backward: bool,
                     chunk: int = 0) -> list[ProgramOp]:
    """Ops of micro-batch j's forward or backward on a stage (pass 3), of model chunk ``chunk`` with virtual
    stages (labelled ``F{j}.{chunk}``)."""
    lay = job.layout
    prev, nxt = _neighbours(job, stage, chunk)
    tag = f"{'B' if backward else 'F'}{j}" + (f".{chunk}" if job.virtual_stages > 1 else "")
    ops: list[ProgramOp] = []
    if not backward and prev is not None:
        ops.append(RecvOp(prev, f"{tag} act"))
    if backward and nxt is not None:
        ops.append(RecvOp(nxt, f"{tag} grad"))
    ops.append(ComputeOp(costs["bwd" if backward else "fwd"], tag))
    if lay.tp > 1 and job.sequence_parallel:
        # megatron/core/tensor_parallel/mappings.py: gather_from_sequence_parallel_region before each column-parallel
        # linear and reduce_scatter_to_sequence_parallel_region after each row-parallel one (their backwards swap).
        act, n = costs["tp"]
        ops.append(CollectiveOp(Dim.TP, Kind.ALLGATHER, act, f"{tag} tp sp-gather", n,
                                megatron="gather_from_sequence_parallel_region"))
        ops.append(CollectiveOp(Dim.TP, Kind.REDUCESCATTER, act, f"{tag} tp sp-scatter", n,
                                megatron="reduce_scatter_to_sequence_parallel_region"))
    elif lay.tp > 1:
        # megatron/core/tensor_parallel/mappings.py: reduce_from_tensor_model_parallel_region after each row-parallel
        # linear forward; the backward of copy_to_tensor_model_parallel_region before each column-parallel one.
        ops.append(CollectiveOp(Dim.TP, Kind.ALLREDUCE, costs["tp"][0], f"{tag} tp", costs["tp"][1],
                                megatron="copy_to_tensor_model_parallel_region" if backward
                                else "reduce_from_tensor_model_parallel_region"))
    if lay.cp > 1:
        ops.append(CollectiveOp(Dim.CP, Kind.REDUCESCATTER if backward else Kind.ALLGATHER, costs["cp"][0] * lay.cp,
                                f"{tag} cp", costs["cp"][1], megatron="TEDotProductAttention"))
    if lay.ep > 1 and costs["ep"][1]:
        ops.append(CollectiveOp(Dim.EP, Kind.ALLTOALL, costs["ep"][0], f"{tag} ep", costs["ep"][1],
                                megatron="MoEAlltoAllTokenDispatcher"))
    # megatron/core/pipeline_parallel/p2p_communication.py: P2PCommunicator.send_forward / send_backward
    # With virtual stages the last stage's forward goes on to stage 0's next chunk, and stage 0's backward
    # back to the last stage's previous chunk (megatron/core/pipeline_parallel/schedules.py,
    # forward_backward_pipelining_with_interleaving: p2p between consecutive virtual stages).
    if not backward and nxt is not None:
        ops.append(SendOp(nxt, costs["pp"], f"{tag} act", megatron="send_forward"))
    if backward and prev is not None:
        ops.append(SendOp(prev, costs["pp"], f"{tag} grad", megatron="send_backward"))
    return ops


def _pipeline_order(job: TrainingJob, stage: int) -> list[tuple[int, bool, int]]:
    """The job's :func:`~lightrail.workload.pipeline.pipeline_order` for ``stage``."""
    return pipeline_order(job.schedule, job.micro_batches, job.layout.pp, job.virtual_stages, stage)


def build_program(job: TrainingJob, *, defer_dp: bool = False) -> Program:
    """Compile one iteration of ``job`` (1F1B, GPipe or interleaved 1F1B, ``job.schedule``) into per-stage op lists.

    ``defer_dp`` moves the gradient buckets after the stage's last pipeline send, so they run as one
    phase at the end instead of overlapping the last backward (a photonic-rails planner choice).

    >>> from lightrail.workload import GPUS, preset
    >>> job = TrainingJob(model=preset("debug"), layout=Layout.from_degrees(8, tp=2, pp=2, gpus_per_server=4),
    ...                   gpu=GPUS["h100"], micro_batches=4)
    >>> [type(op).__name__ for op in build_program(job).stages[0][:3]]
    ['ComputeOp', 'CollectiveOp', 'SendOp']
    """
    from lightrail.workload import megatron  # it builds on this module's ops

    stages = []
    for s in range(job.layout.pp):
        costs = [_stage_costs(job, s, c) for c in range(job.virtual_stages)]
        order = _pipeline_order(job, s)
        ops: list[ProgramOp] = megatron.param_gather_behind_forward(job, s) if job.megatron_step else []
        for idx, (j, backward, c) in enumerate(order):
            chunk = _micro_batch_ops(job, costs[c], s, j, backward, c)
            if idx == len(order) - 1 and not job.megatron_step:
                chunk = megatron.gradient_sync_alone(job, s, chunk, defer_dp=defer_dp)
            elif idx == len(order) - 1:
                chunk = megatron.last_backward(job, s, chunk, defer_dp=defer_dp)
                chunk += megatron.step(job, s)
            ops.extend(chunk)
        stages.append(tuple(ops))
    return Program(job, tuple(stages), {"defer_dp": defer_dp})
