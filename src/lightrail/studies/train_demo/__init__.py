"""A small GPT trained on CPU with tensor, pipeline and data parallelism over explicit process groups.

The training workload of the end-to-end demo. Every communication goes through a group this module
creates with ``dist.new_group`` (never the default group), so a backend that wraps another one and
intercepts each collective and send/recv per group sees the whole job's traffic:

* **TP** (Megatron-style): column-parallel QKV and MLP-in, row-parallel attention-out and MLP-out;
  one all_reduce per row-parallel layer in forward (``_ReduceFromTP``) and one per column-parallel
  input in backward (``_CopyToTP``). Embedding, LayerNorms, row-parallel biases and the LM head are
  replicated across TP ranks (their gradients are identical there, so they need no TP reduction).
* **PP** (GPipe): every stage runs all microbatches forward, then all backward in reverse order,
  with blocking ``dist.send``/``dist.recv`` of activations and gradients to adjacent stages in the
  PP group (group-local ranks, which equal the stage index).
* **DP**: after backward each stage's gradients (and, on the last stage, the step loss) travel in
  one flat all_reduce over the DP group, then are divided by dp.

Ranks follow :class:`lightrail.workload.parallel.Layout` (Megatron order: tp fastest, then dp, then
pp), the same placement the simulator assumes. Parameters are drawn per (seed, layer, name) at full
size and sharded, and microbatch ``j`` of a step's global batch (``dp * microbatches`` microbatches,
replica ``d`` taking ``d*microbatches ...``) is drawn per (seed, step, j), so the model and data do
not depend on the layout: tp=pp=dp=1 with ``microbatches * dp`` microbatches computes the same
losses up to float reassociation. Runs are deterministic: the same config on the same backend
numerics gives bit-identical losses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import signal
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError
from lightrail.runtime.launch import Elastic, Notice, run_elastic, run_processes
from lightrail.runtime.torch_backend import Agent, idle_stats, registered
from lightrail.workload.parallel import Dim, Layout

__all__ = ["DemoConfig", "ReplicaRun", "DemoRun", "train_worker", "run_demo", "Failure", "Recovery", "FailoverRun",
           "elastic_train_worker", "run_failover_demo"]

_GROUP_DIMS = (Dim.TP, Dim.DP, Dim.PP)
"""Order in which every rank creates the groups (all of one dimension before the next)."""


@dataclass(frozen=True)
class DemoConfig:
    """Model, batch and parallel layout of the demo; checked on construction.

    ``microbatches`` is per DP replica per step (a step's global batch is ``dp * microbatches *
    micro_batch`` sequences). ``ranks`` is optional and, when given, must equal ``tp * pp * dp``.
    """

    vocab: int = 256
    seq: int = 32
    d_model: int = 64
    heads: int = 4
    layers: int = 4
    micro_batch: int = 4
    microbatches: int = 4
    steps: int = 20
    lr: float = 1e-3
    seed: int = 0
    tp: int = 2
    pp: int = 2
    dp: int = 2
    ranks: int | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("lr", "seed") or (f.name == "ranks" and value is None):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{f.name}={value!r} must be a positive integer", field=_flag(f.name))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ScenarioError(f"seed={self.seed!r} must be a non-negative integer", field="--seed")
        if not isinstance(self.lr, int | float) or not math.isfinite(self.lr) or self.lr <= 0:
            raise ScenarioError(f"lr={self.lr!r} must be a positive number", field="--lr", fix="e.g. 1e-3")
        product = self.tp * self.pp * self.dp
        if self.ranks is not None and self.ranks != product:
            raise ScenarioError(f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) = {product} != ranks({self.ranks})",
                                field="--ranks", fix=f"use --ranks {product} or change --tp/--pp/--dp")
        if self.vocab < 2:
            raise ScenarioError(f"vocab={self.vocab} needs at least 2 tokens", field="--vocab")
        if self.d_model % self.heads:
            raise ScenarioError(f"d_model={self.d_model} is not divisible by heads={self.heads}", field="--heads",
                                fix=f"use a divisor of {self.d_model}")
        if self.heads % self.tp:
            raise ScenarioError(f"heads={self.heads} are not divisible by tp={self.tp}", field="--tp",
                                fix=f"use a divisor of {self.heads}: each TP rank holds whole heads")
        if self.layers % self.pp:
            raise ScenarioError(f"layers={self.layers} are not divisible by pp={self.pp}", field="--pp",
                                fix=f"use a divisor of {self.layers}: every stage holds the same number of layers")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def layout(self) -> Layout:
        """Rank layout; servers are as large as the job (group membership does not depend on them)."""
        return Layout.from_degrees(self.world, tp=self.tp, pp=self.pp, dp=self.dp, gpus_per_server=self.world)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _seed(*parts) -> int:
    """A stable 63-bit seed from parts (Python's ``hash`` of str varies between processes)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def _normal(config: DemoConfig, layer: int | str, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(config.seed, layer, name))
    return torch.randn(shape, generator=g) * std


def _batch(config: DemoConfig, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global microbatch ``index`` of ``step``: (inputs, targets), each (micro_batch, seq) int64.

    Each sequence counts from a random start by a random stride of 1-3 (mod vocab): learnable from
    the previous two tokens, and the bigram alone already brings the loss from ln(vocab) to ~ln 3.
    """
    g = torch.Generator().manual_seed(_seed(config.seed, "data", step, index))
    start = torch.randint(config.vocab, (config.micro_batch, 1), generator=g)
    stride = torch.randint(1, 4, (config.micro_batch, 1), generator=g)
    tokens = (start + stride * torch.arange(config.seq + 1)) % config.vocab
    return tokens[:, :-1], tokens[:, 1:]


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all_reduce of the gradient over the TP group backward (column-parallel input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """all_reduce over the TP group forward (row-parallel output); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Block(nn.Module):
    """Pre-LN transformer block holding TP rank ``tp_rank``'s shard of heads and MLP columns."""

    def __init__(self, config: DemoConfig, layer: int, tp_rank: int, tp_group):
        super().__init__()
        d, tp, f = config.d_model, config.tp, 4 * config.d_model
        self.group = tp_group
        self.heads = config.heads // tp
        self.head_dim = d // config.heads
        cols = slice(tp_rank * d // tp, (tp_rank + 1) * d // tp)
        hidden = slice(tp_rank * f // tp, (tp_rank + 1) * f // tp)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * config.layers)
        self.ln1 = nn.LayerNorm(d)
        self.wqkv = nn.Parameter(torch.cat([_normal(config, layer, n, (d, d), std)[cols] for n in ("wq", "wk", "wv")]))
        self.bqkv = nn.Parameter(torch.zeros(3 * d // tp))
        self.wo = nn.Parameter(_normal(config, layer, "wo", (d, d), out_std)[:, cols].contiguous())
        self.bo = nn.Parameter(torch.zeros(d))
        self.ln2 = nn.LayerNorm(d)
        self.w1 = nn.Parameter(_normal(config, layer, "w1", (f, d), std)[hidden].contiguous())
        self.b1 = nn.Parameter(torch.zeros(f // tp))
        self.w2 = nn.Parameter(_normal(config, layer, "w2", (d, f), out_std)[:, hidden].contiguous())
        self.b2 = nn.Parameter(torch.zeros(d))

    def _copy(self, x):
        return x if self.group is None else _CopyToTP.apply(x, self.group)

    def _reduce(self, x):
        return x if self.group is None else _ReduceFromTP.apply(x, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = F.linear(self._copy(self.ln1(x)), self.wqkv, self.bqkv)
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2) for z in qkv.chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        attn = attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        x = x + self._reduce(F.linear(attn, self.wo)) + self.bo
        hidden = F.gelu(F.linear(self._copy(self.ln2(x)), self.w1, self.b1))
        return x + self._reduce(F.linear(hidden, self.w2)) + self.b2


class _Stage(nn.Module):
    """One pipeline stage: embeddings on the first, ``layers / pp`` blocks, final LN and LM head on the last."""

    def __init__(self, config: DemoConfig, stage: int, tp_rank: int, tp_group):
        super().__init__()
        per = config.layers // config.pp
        self.first, self.last = stage == 0, stage == config.pp - 1
        if self.first:
            self.tok = nn.Parameter(_normal(config, "embed", "tok", (config.vocab, config.d_model), 0.02))
            self.pos = nn.Parameter(_normal(config, "embed", "pos", (config.seq, config.d_model), 0.02))
        self.blocks = nn.ModuleList(_Block(config, layer, tp_rank, tp_group)
                                    for layer in range(stage * per, (stage + 1) * per))
        if self.last:
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Parameter(_normal(config, "head", "w", (config.vocab, config.d_model), 0.02))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok[x] + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = F.linear(self.ln_f(x), self.head)
        return x


class _Adam:
    """Plain Adam (betas 0.9/0.999, eps 1e-8), written out: ``torch.optim`` imports torch._dynamo on first
    use, which costs each of many ranks sharing a few cores seconds of start-up."""

    def __init__(self, params: list[nn.Parameter], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)


def _make_groups(layout: Layout, rank: int, backend: str | None = None) -> dict[Dim, dist.ProcessGroup | None]:
    """Create every TP, DP and PP group (dimensions of degree 1 get none) in the same order on all ranks,
    on ``backend`` (default: the default group's).

    Returns the groups this rank belongs to; None for a dimension of degree 1.
    """
    mine: dict[Dim, dist.ProcessGroup | None] = {}
    for dim in _GROUP_DIMS:
        mine[dim] = None
        if layout.degree(dim) == 1:
            continue
        for i, ranks in enumerate(layout.groups(dim).tolist()):
            group = dist.new_group(ranks, group_desc=f"{dim.value}{i}{'-' + backend if backend else ''}",
                                   backend=backend)
            if rank in ranks:
                mine[dim] = group
    return mine


def _bits(value: float) -> int:
    """The float32 bit pattern of ``value`` as an int."""
    return int(torch.tensor([value], dtype=torch.float32).view(torch.int32).item())


def train_worker(rank: int, world: int, config: DemoConfig, baseline: str | tuple[str, ...] | None = None,
                 block: int = 5, on_step: Callable[[int, int], None] | None = None, *,
                 context: Agent | None = None) -> dict:
    """Train ``config.steps`` steps as ``rank`` of ``world`` (default group already initialised).

    Returns ``{"rank", "stage", "tp_rank", "dp_rank", "losses", "loss_bits", "iteration_s", "controller",
    "step_start_s", "timeline"}``; ``losses`` (step losses averaged over the global batch, float32 values) and
    ``loss_bits`` (their float32 bit patterns) are empty except on the last pipeline stage; ``timeline`` is the
    lightrail agent's record of the replica's ops (``Agent.timeline``; empty on gloo), ``step_start_s`` when each
    step started (the same clock).

    With ``baseline`` (a backend name, or several), a replica of the model trains on groups of each baseline
    backend in the same processes, the replicas taking turns in blocks of ``block`` steps (the order rotating
    from block to block; with one baseline, the baseline first in even blocks), so all are timed under the same
    load; the first baseline's results are under ``"baseline"``, every baseline's under ``"baselines"``.

    ``context`` is the lightrail backend's agent of this process when the groups run on it (what
    ``torch_backend.setup`` returned in the launcher's ``init``): its controller requests are counted
    per step, reported under ``"controller"``, and it leaves the controller when training ends.

    ``on_step(rank, step)`` (picklable) runs after each step of the main replica, e.g. to tell the launcher
    how far training got (the train-demo kills its controller at a step).
    """
    if world != config.world:
        raise ScenarioError(f"{world} ranks run a layout of tp({config.tp}) * pp({config.pp}) * dp({config.dp}) "
                            f"= {config.world}", field="--ranks", fix=f"launch {config.world} ranks")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many ranks share few cores
    try:
        layout = config.layout()
        main = _Replica(config, rank, _make_groups(layout, rank), context, ops=context)
        if baseline is None:
            for step in range(config.steps):
                main.step(step)
                if on_step is not None:
                    on_step(rank, step)
            return main.result(rank)
        others = [_Replica(config, rank, _make_groups(layout, rank, b), context, ops=registered(b))
                  for b in ((baseline,) if isinstance(baseline, str) else baseline)]
        replicas = [*others, main]
        for first in range(0, config.steps, block):
            steps = range(first, min(first + block, config.steps))
            turn = first // block % len(replicas)
            for replica in replicas[turn:] + replicas[:turn]:
                for step in steps:
                    replica.step(step)
                    if on_step is not None and replica is main:
                        on_step(rank, step)
        return {**main.result(rank), "baseline": others[0].result(rank),
                "baselines": [other.result(rank) for other in others]}
    finally:
        if context is not None:
            context.close()
        torch.set_num_threads(threads)


class _Replica:
    """One copy of the model on one set of groups, with its losses, step times and controller requests."""

    def __init__(self, config: DemoConfig, rank: int, groups: dict, agent: Agent | None, *, ops: Agent | None = None):
        self.agent = agent  # shared by both replicas: requests count wherever they happen (acks of revokes)
        self.ops = ops  # the agent running this replica's groups (lightrail backends): its op timeline
        coords = {d: int(c) for d, c in config.layout().coords(rank).items()}
        self.config, self.groups = config, groups
        self.stage, self.tp_rank, self.dp_rank = coords[Dim.PP], coords[Dim.TP], coords[Dim.DP]
        self.rank = rank
        self.model = _Stage(config, self.stage, self.tp_rank, groups[Dim.TP])
        self.params = list(self.model.parameters())
        self.optimizer = _Adam(self.params, config.lr)
        self.losses, self.times, self.requests, self.starts = [], [], [], []
        self.snapshots: deque = deque(maxlen=3)  # (step, tensors, adam t); only kept with spares

    def step(self, step: int) -> None:
        start, sent = time.perf_counter(), self._requests()
        self.starts.append(start)
        for p in self.params:
            p.grad = None
        loss = _pipeline_step(self.config, self.model, step, self.stage, self.dp_rank, self.groups[Dim.PP])
        loss = _sync_gradients(self.config, self.params, loss, self.groups[Dim.DP])
        self.optimizer.step()
        self.times.append(time.perf_counter() - start)
        self.requests.append(self._requests() - sent)
        if loss is not None:
            self.losses.append(loss)

    def _requests(self) -> int:
        return 0 if self.agent is None else self.agent.requests

    # -- failover: in-memory checkpoints, new groups, restore ---------------------------------------------
    def snapshot(self, step: int) -> None:
        """Keep this rank's state after ``step`` (the last few): a DP replica holds the same, so it is
        the failed rank's checkpoint too, in memory on a peer."""
        opt = self.optimizer
        self.snapshots.append((step, [x.detach().clone() for x in (*self.params, *opt.m, *opt.v)], opt.t))

    def last_step(self) -> int:
        return self.snapshots[-1][0]

    def rollback(self, step: int) -> None:
        """Back to the state after ``step`` (-1: the initial one); later steps' records are dropped."""
        saved = next((s for s in self.snapshots if s[0] == step), None)
        if saved is None:
            raise InfeasibleError(f"no checkpoint of step {step} on rank {self.rank} (holds "
                                  f"{[s[0] for s in self.snapshots]})", field="checkpoint")
        with torch.no_grad():
            for x, y in zip((*self.params, *self.optimizer.m, *self.optimizer.v), saved[1], strict=True):
                x.copy_(y)
        self.optimizer.t = saved[2]
        self._truncate(step)
        while self.snapshots[-1][0] > step:
            self.snapshots.pop()

    def _truncate(self, step: int) -> None:
        self.losses = self.losses[: step + 1] if self.stage == self.config.pp - 1 else []
        self.times, self.requests = self.times[: step + 1], self.requests[: step + 1]
        self.starts = self.starts[: step + 1]

    def regroup(self, groups: dict) -> None:
        """Use a new generation's groups (the model's TP layers hold theirs)."""
        self.groups = groups
        for block in self.model.blocks:
            block.group = groups[Dim.TP]

    def state_vector(self, step: int) -> torch.Tensor:
        """Parameters, Adam moments and step count and, on the last stage, the losses up to ``step``: what
        a spare taking this rank's place over needs, in one flat tensor."""
        opt = self.optimizer
        pieces = [x.detach().reshape(-1) for x in (*self.params, *opt.m, *opt.v)]
        pieces.append(torch.tensor([float(opt.t), *self.losses[: step + 1]], dtype=torch.float32))
        return torch.cat(pieces)

    def load_state_vector(self, flat: torch.Tensor, step: int) -> None:
        opt, offset = self.optimizer, 0
        with torch.no_grad():
            for x in (*self.params, *opt.m, *opt.v):
                x.copy_(flat[offset: offset + x.numel()].view_as(x))
                offset += x.numel()
        opt.t = int(flat[offset])
        last = self.stage == self.config.pp - 1
        self.losses = [float(v) for v in flat[offset + 1:]] if last else []
        # steps this process did not run: no time, no requests of its own
        self.times, self.requests, self.starts = [0.0] * (step + 1), [0] * (step + 1), [0.0] * (step + 1)
        self.snapshots.clear()
        self.snapshot(step)

    def vector_size(self, step: int) -> int:
        n = 3 * sum(p.numel() for p in self.params) + 1
        return n + (step + 1 if self.stage == self.config.pp - 1 else 0)

    def result(self, rank: int) -> dict:
        controller = idle_stats() if self.agent is None else self.agent.stats()  # none on plain gloo
        controller["requests_per_step"] = self.requests
        return {"rank": rank, "stage": self.stage, "tp_rank": self.tp_rank, "dp_rank": self.dp_rank,
                "losses": self.losses, "loss_bits": [_bits(x) for x in self.losses], "iteration_s": self.times,
                "controller": controller, "step_start_s": self.starts,
                "timeline": [] if self.ops is None else list(self.ops.timeline)}


def _pipeline_step(config: DemoConfig, model: _Stage, step: int, stage: int, dp_rank: int, pp_group):
    """GPipe: all microbatches forward, then all backward in reverse order; returns this replica's
    mean loss (a 0-d tensor) on the last stage, else None. Gradients accumulate in the parameters."""
    m = config.microbatches
    shape = (config.micro_batch, config.seq, config.d_model)
    inputs, outputs = [], []
    for i in range(m):
        tokens, targets = _batch(config, step, dp_rank * m + i)
        if model.first:
            x = tokens
        else:
            x = torch.empty(shape)
            dist.recv(x, group=pp_group, group_src=stage - 1)
            x.requires_grad_()
        y = model(x)
        if model.last:
            y = F.cross_entropy(y.reshape(-1, config.vocab), targets.reshape(-1)) / m
        else:
            dist.send(y.detach().contiguous(), group=pp_group, group_dst=stage + 1)
        inputs.append(x)
        outputs.append(y)
    for i in reversed(range(m)):
        if model.last:
            outputs[i].backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, group=pp_group, group_src=stage + 1)
            outputs[i].backward(grad)
        if not model.first:
            dist.send(inputs[i].grad.contiguous(), group=pp_group, group_dst=stage - 1)
    if model.last:
        return torch.stack([y.detach() for y in outputs]).sum()
    return None


def _sync_gradients(config: DemoConfig, params: list[nn.Parameter], loss, dp_group) -> float | None:
    """Average gradients (and the loss, riding in the same flat buffer) over the DP group; return the loss."""
    pieces = [p.grad.reshape(-1) for p in params]
    if loss is not None:
        pieces.append(loss.reshape(1))
    flat = torch.cat(pieces)
    if dp_group is not None:
        dist.all_reduce(flat, group=dp_group)
        flat /= config.dp
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
        offset += p.numel()
    return float(flat[-1]) if loss is not None else None


@dataclass(frozen=True)
class ReplicaRun:
    """One replica's training over all ranks: its backend, losses and per-step times."""

    backend: str
    losses: tuple[float, ...]
    """Step losses, from the last stage's first rank (float32 values)."""
    loss_bits: tuple[int, ...]
    """Their float32 bit patterns: equal bits mean identical numerics."""
    losses_consistent: bool
    """Every last-stage rank reported the same bits."""
    iteration_s: tuple[float, ...]
    """Per step, the slowest rank's time."""
    median_iteration_s: float
    """Median of ``iteration_s`` without warm-up steps (see :func:`run_demo`)."""

    def to_dict(self) -> dict:
        return {"backend": self.backend, "losses": list(self.losses), "loss_bits": list(self.loss_bits),
                "losses_consistent": self.losses_consistent, "iteration_s": list(self.iteration_s),
                "median_iteration_s": self.median_iteration_s}


@dataclass(frozen=True)
class DemoRun:
    """What :func:`run_demo` returns: the run on its backend, every rank's raw result, and the baseline
    replica's run when there is one."""

    config: DemoConfig
    world: int
    main: ReplicaRun
    ranks: tuple[dict, ...]
    """Each rank's result, as :func:`train_worker` returns it."""
    baseline: ReplicaRun | None = None
    others: tuple[ReplicaRun, ...] = ()
    """The baselines after the first, when several trained (``run_demo(..., baseline=(a, b))``)."""

    def to_dict(self) -> dict:
        """``{"config", "backend", "world", "losses", "loss_bits", "losses_consistent", "iteration_s",
        "median_iteration_s", "ranks"}`` and, with a baseline, ``"baseline"`` (its backend and the same keys)."""
        main = self.main.to_dict()
        out = {"config": asdict(self.config), "backend": main.pop("backend"), "world": self.world, **main,
               "ranks": list(self.ranks)}
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
        return out


def run_demo(config: DemoConfig, *, backend: str = "gloo", init: Callable[[], Any] | None = None,
             pg_options: Any = None, baseline: str | tuple[str, ...] | None = None, block: int = 5,
             on_step: Callable[[int, int], None] | None = None) -> DemoRun:
    """Train ``config`` on ``config.world`` spawned CPU processes over ``backend``; aggregate the results.

    ``init`` (picklable, no arguments) runs in every worker before the default group exists, e.g.
    to register ``backend`` (``functools.partial(torch_backend.setup, backend_config)``: its agent
    reaches :func:`train_worker` as ``context``). The losses come from the last stage's first rank,
    with whether every last-stage rank reported the same bits; the per-step time is the slowest
    rank's, and its median leaves out the first (warm-up) step.

    With ``baseline`` (one backend or several), a replica also trains on each in the same processes, in
    blocks of ``block`` steps taking turns (see :func:`train_worker`); every median leaves out the first step
    of every block (the first one after a switch of backend finds the fabric as the other replica's block
    left it).
    """
    results = run_processes(train_worker, config.world, config, baseline, block, on_step, backend=backend, init=init,
                            pg_options=pg_options)
    skip = set(range(0, config.steps, block)) if baseline else {0}
    names = (baseline,) if isinstance(baseline, str) else tuple(baseline or ())
    runs = [_aggregate(config, name, [r["baselines"][k] for r in results], skip) for k, name in enumerate(names)]
    return DemoRun(config, config.world, _aggregate(config, backend, results, skip), tuple(results),
                   runs[0] if runs else None, tuple(runs[1:]))


def _aggregate(config: DemoConfig, backend: str, results: list[dict], skip: set[int]) -> ReplicaRun:
    reporters = [r for r in results if r["stage"] == config.pp - 1]
    first = reporters[0]
    per_step = [max(r["iteration_s"][s] for r in results) for s in range(config.steps)]
    kept = [t for s, t in enumerate(per_step) if s not in skip] or per_step
    return ReplicaRun(backend, tuple(first["losses"]), tuple(first["loss_bits"]),
                      all(r["loss_bits"] == first["loss_bits"] for r in reporters), tuple(per_step),
                      statistics.median(kept))


# -- spares: a rank killed mid-training, a spare spliced in (LUMION), training resumed from a peer's copy --


@dataclass(frozen=True)
class Failure:
    """Which rank's process is killed (SIGKILL, by itself) at the start of which step, in the first generation;
    ``hang`` stops it instead (SIGSTOP): the controller fails it when its heartbeats stop, and the launcher
    kills it then."""

    rank: int
    step: int
    hang: bool = False


def _recovery_error(error: BaseException) -> bool:
    """Errors a rank sees when a peer died: gloo's closed connection or timeout (RuntimeError,
    ``dist.DistError``) or the controller's Failover / RankFailed answer (a LightrailError)."""
    return isinstance(error, RuntimeError | LightrailError | dist.DistError)


def elastic_train_worker(proc: int, world: int, config: DemoConfig, failure: Failure | None, backend: str = "gloo",
                         on_step: Callable[[int, int], None] | None = None,
                         before_failure: Callable[[Agent | None], None] | None = None,
                         *, context: Agent | None = None, elastic: Elastic) -> dict:
    """Train as process ``proc`` of :func:`run_elastic` (rank ``proc``, or an idle spare for ``proc >= world``).

    Each rank keeps its state after its last few steps in memory; a DP replica holds the same, so a
    failed rank's checkpoint lives on its peer. When a peer dies, every op that waits on it fails
    (gloo: connection closed; the controller wakes blocked acquires), the rank drops its groups —
    closing its connections, so ranks blocked on it fail in turn — and waits for the launcher's
    notice: the next generation's groups are built on a fresh store prefix, the ranks agree on the
    last step every survivor completed, roll back to it, the spare receives the failed rank's state
    from its DP peer (a broadcast over the DP group), and training continues from there.

    ``on_step(rank, step)`` runs after each completed step (logical rank: a spare reports as the rank it took
    over); ``before_failure(agent)`` runs in the failing rank just before it dies (the train-demo waits there
    for a controller restart to settle, see ``photonic_demo.ControllerKiller``).
    """
    if config.dp < 2:
        raise ScenarioError("a spare restores the failed rank's state from a DP replica, and dp is 1", field="--dp",
                            fix="use --dp 2 or more with --spares")
    torch.set_num_threads(1)
    layout, agent, generation = config.layout(), context, 0
    records: list[dict] = []
    notice: Notice | None = None
    if elastic.spare:
        if agent is not None:
            agent.connect_spare(proc - world)
        _warm_up(config)
        while True:  # idle until a notice names this spare (or the job ends: rank -1)
            notice = elastic.notice(generation + 1, timeout_s=86400.0)  # the launcher ends it (rank -1)
            generation = notice.generation
            if notice.spare == proc or notice.spare is None:
                break
        if notice.spare != proc:
            if agent is not None:
                agent.close()
            return {"spare": proc, "used": False}
        rank = notice.rank
    else:
        rank = proc
    replica: _Replica | None = None
    pending: dict = {}
    try:
        while True:
            record = None
            if notice is not None:  # this generation starts after a failure
                record = {"generation": generation, "rank": rank, "spare": elastic.spare and replica is None,
                          "t_notice": time.time(), "t_detected": notice.t_detected, **pending}
                if agent is not None:
                    record.update(agent.failover(notice.rank, notice.spare, spare_index=notice.spare - world))
            elastic.init_group(backend, rank, generation)
            if replica is None:
                replica = _Replica(config, rank, _make_groups(layout, rank), agent)
                replica.snapshot(-1)
            else:
                replica.regroup(_make_groups(layout, rank))  # the replica holds the only references to them
            start = 0
            if record is not None:
                record["t_rebuilt"] = time.time()
                start = _restore(elastic, replica, generation, notice, record) + 1
                record["t_restored"] = time.time()
                records.append(record)
            failed = False
            try:
                for step in range(start, config.steps):
                    if failure is not None and generation == 0 and rank == failure.rank and step == failure.step:
                        if before_failure is not None:
                            before_failure(agent)
                        elastic.mark("killed")
                        os.kill(os.getpid(), signal.SIGSTOP if failure.hang else signal.SIGKILL)
                    replica.step(step)
                    replica.snapshot(step)
                    if on_step is not None:
                        on_step(rank, step)
                    if record is not None and "t_first_step" not in record:
                        record["t_first_step"] = time.time()
            except Exception as e:  # noqa: BLE001 (sorted below; the traceback is not kept: it holds the groups)
                if not _recovery_error(e):
                    raise
                failed, reason = True, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if not failed:
                return {**replica.result(rank), "recovery": records, "proc": proc}
            t_error = time.time()
            push = agent.pending_failure() if agent is not None else None
            if push is not None and push.get("op") == "failover":
                elastic.report_failed(push["rank"], generation)  # a hung rank's process still lives
            _drop_groups(replica, agent)
            notice = elastic.notice(generation + 1, timeout_s=elastic.timeout_s)
            if notice.spare is None:
                raise InfeasibleError(f"rank {notice.rank} failed and no spare is left", field="--spares",
                                      fix="start the job with (more) --spares")
            generation = notice.generation
            pending = {"t_error": t_error, "error": reason}
    finally:
        if agent is not None:
            agent.close()


def _warm_up(config: DemoConfig) -> None:
    """A spare's hot standby: one step of a one-rank copy of the model (same widths), so its first step after
    taking a rank over does not pay torch's first-call costs (3.4 s of a 3.8 s step, 8 ranks on 2 loaded cores)."""
    one = dataclasses.replace(config, tp=1, pp=1, dp=1, layers=1, microbatches=1, steps=1, ranks=None)
    _Replica(one, 0, {Dim.TP: None, Dim.DP: None, Dim.PP: None}, None).step(0)


def _drop_groups(replica: _Replica, agent: Agent | None) -> None:
    """Let go of every group of the failed generation: their gloo connections close, so a peer blocked
    on this rank fails now instead of at its timeout (the cascade that wakes the whole job)."""
    replica.groups = {}
    for block in replica.model.blocks:
        block.group = None
    if agent is not None:
        agent.abort()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (a group whose peer died may fail to shut down; it is gone either way)
        pass
    # no gc.collect(): reference counting frees the groups (the failed step's autograd graph went with its
    # traceback), and a full collection costs each of 8 ranks on 2 cores ~2 s, more than the whole recovery


def _restore(elastic: Elastic, replica: _Replica, generation: int, notice: Notice, record: dict) -> int:
    """Agree on the checkpoint (the last step every survivor completed), roll back to it, and send the
    failed rank's state from its DP peer to the spare. Returns the checkpoint's step."""
    store, world, config = elastic.store, elastic.world, replica.config
    taking_over = record["spare"]
    if not taking_over:
        store.set(f"g{generation}/last/{replica.rank}", str(replica.last_step()))
    survivors = [r for r in range(world) if r != notice.rank]
    lasts = [int(store.get(f"g{generation}/last/{r}")) for r in survivors]
    step = min(lasts)
    record.update(checkpoint_step=step, steps_lost=max(lasts) - step)
    if not taking_over:
        replica.rollback(step)
    layout = config.layout()
    dp_ranks = next(g for g in layout.groups(Dim.DP).tolist() if replica.rank in g)
    if notice.rank in dp_ranks:  # the failed rank's DP group: its lowest survivor sends the checkpoint
        source = next(r for r in dp_ranks if r != notice.rank)
        flat = replica.state_vector(step) if not taking_over else torch.empty(replica.vector_size(step))
        dist.broadcast(flat, group=replica.groups[Dim.DP], group_src=dp_ranks.index(source))
        if taking_over:
            replica.load_state_vector(flat, step)
    return step


@dataclass(frozen=True)
class Recovery:
    """One failover's timeline, in seconds: from the kill to its detection (the controller's ``failover``
    push, or the launcher seeing the process end without one), the OCS rewiring the spare in, every rank's
    new process groups, the checkpoint restored, and the first step completed after it (from the kill)."""

    rank: int
    """The logical rank whose process died."""
    spare: int
    """The spare (process index) that took it over."""
    checkpoint_step: int
    """Training resumed after this step (the last every survivor completed; -1: from the start)."""
    steps_lost: int
    """Steps some rank had completed beyond the checkpoint (redone)."""
    detected_by: str
    detect_s: float
    rewire_s: float
    rebuild_s: float
    restore_s: float
    first_step_s: float
    woken_by: dict[str, int]
    """How the survivors learned of it: ``connection`` (a gloo op failed: the dead peer's or a dropped group's
    connection closed), ``controller`` (an acquire failed, or the push arrived between ops), ``timeout``
    (gloo's backstop: the cascade missed a rank), ``other``."""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["woken_by"] = dict(self.woken_by)
        return out


def _woken_by(reason: str) -> str:
    if "Timed out" in reason or "timeout" in reason.lower():
        return "timeout"
    if reason.startswith("ControllerError"):
        return "controller"
    if "Connection" in reason or "Read error" in reason or "reset" in reason:
        return "connection"
    return "other"


@dataclass(frozen=True)
class FailoverRun:
    """What :func:`run_failover_demo` returns: the run (losses over every step, across the failure), every
    logical rank's result, and one :class:`Recovery` per failure."""

    config: DemoConfig
    main: ReplicaRun
    ranks: tuple[dict, ...]
    recoveries: tuple[Recovery, ...]
    spares: int

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "spares": self.spares, **self.main.to_dict(),
                "recoveries": [r.to_dict() for r in self.recoveries]}


def run_failover_demo(config: DemoConfig, *, spares: int, failure: Failure | None, backend: str = "gloo",
                      init: Callable[[], Any] | None = None, timeout_s: float = 30.0,
                      on_step: Callable[[int, int], None] | None = None,
                      before_failure: Callable[[Agent | None], None] | None = None) -> FailoverRun:
    """Train ``config`` on ``config.world`` ranks plus ``spares`` idle spare processes (``run_elastic``);
    ``failure`` kills one rank's process at the start of a step. ``timeout_s`` bounds every gloo op (a
    backstop: a rank blocked on a dead peer fails as soon as a peer drops its connections). ``on_step`` and
    ``before_failure`` (picklable) are :func:`elastic_train_worker`'s."""
    if failure is not None:
        if not 0 <= failure.rank < config.world:
            raise ScenarioError(f"--kill-rank {failure.rank} is not a rank of {config.world}", field="--kill-rank",
                                fix=f"use 0..{config.world - 1}")
        if not 0 <= failure.step < config.steps:
            raise ScenarioError(f"--kill-at-step {failure.step} is not a step of {config.steps}",
                                field="--kill-at-step", fix=f"use 0..{config.steps - 1}")
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        raise ScenarioError(f"--spares {spares!r} must be a non-negative integer", field="--spares")
    if config.dp < 2:
        raise ScenarioError("a spare restores the failed rank's state from a DP replica, and dp is 1", field="--dp",
                            fix="use --dp 2 or more with --spares")
    results, notices, marks = run_elastic(elastic_train_worker, config.world, spares, config, failure, backend,
                                          on_step, before_failure, init=init, timeout_s=timeout_s)
    recoveries = []
    for notice in notices:
        if notice.spare is None or notice.rank < 0:
            continue
        records = [rec for r in results for rec in r["recovery"] if rec["generation"] == notice.generation]
        t_fail = marks.get("killed", min(rec.get("t_error", notice.t_detected) for rec in records))
        pushes = [rec["t_push"] for rec in records if rec.get("t_push") is not None]
        t_detect = min(pushes) if pushes else notice.t_detected
        rewire = [rec["rewire_s"] for rec in records if rec.get("rewire_s") is not None]
        rebuilt = max(rec["t_rebuilt"] for rec in records)
        recoveries.append(Recovery(
            rank=notice.rank, spare=notice.spare, checkpoint_step=records[0]["checkpoint_step"],
            steps_lost=max(rec["steps_lost"] for rec in records),
            detected_by="controller" if pushes else "launcher", detect_s=t_detect - t_fail,
            rewire_s=max(rewire) if rewire else 0.0, rebuild_s=rebuilt - t_detect,
            restore_s=max(rec["t_restored"] for rec in records) - rebuilt,
            first_step_s=max(rec.get("t_first_step", math.nan) for rec in records) - t_fail,
            woken_by=dict(Counter(_woken_by(rec["error"]) for rec in records if "error" in rec))))
    return FailoverRun(config, _aggregate(config, backend, results, {0}), tuple(results), tuple(recoveries), spares)
