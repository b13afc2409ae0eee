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

import hashlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightrail.errors import ScenarioError
from lightrail.runtime.launch import run_processes
from lightrail.runtime.torch_backend import Agent, idle_stats
from lightrail.workload.parallel import Dim, Layout

__all__ = ["DemoConfig", "ReplicaRun", "DemoRun", "train_worker", "run_demo"]

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


def train_worker(rank: int, world: int, config: DemoConfig, baseline: str | None = None, block: int = 5, *,
                 context: Agent | None = None) -> dict:
    """Train ``config.steps`` steps as ``rank`` of ``world`` (default group already initialised).

    Returns ``{"rank", "stage", "tp_rank", "dp_rank", "losses", "loss_bits", "iteration_s", "controller"}``;
    ``losses`` (step losses averaged over the global batch, float32 values) and ``loss_bits`` (their
    float32 bit patterns) are empty except on the last pipeline stage.

    With ``baseline`` (a backend name), a second replica of the model trains on groups of that backend
    in the same processes, in alternating blocks of ``block`` steps (the baseline first in even
    blocks), so both are timed under the same load; its results are under ``"baseline"``.

    ``context`` is the lightrail backend's agent of this process when the groups run on it (what
    ``torch_backend.setup`` returned in the launcher's ``init``): its controller requests are counted
    per step, reported under ``"controller"``, and it leaves the controller when training ends.
    """
    if world != config.world:
        raise ScenarioError(f"{world} ranks run a layout of tp({config.tp}) * pp({config.pp}) * dp({config.dp}) "
                            f"= {config.world}", field="--ranks", fix=f"launch {config.world} ranks")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many ranks share few cores
    try:
        layout = config.layout()
        main = _Replica(config, rank, _make_groups(layout, rank), context)
        if baseline is None:
            for step in range(config.steps):
                main.step(step)
            return main.result(rank)
        other = _Replica(config, rank, _make_groups(layout, rank, baseline), context)
        for first in range(0, config.steps, block):
            steps = range(first, min(first + block, config.steps))
            for replica in ((other, main) if first // block % 2 == 0 else (main, other)):
                for step in steps:
                    replica.step(step)
        return {**main.result(rank), "baseline": other.result(rank)}
    finally:
        if context is not None:
            context.close()
        torch.set_num_threads(threads)


class _Replica:
    """One copy of the model on one set of groups, with its losses, step times and controller requests."""

    def __init__(self, config: DemoConfig, rank: int, groups: dict, agent: Agent | None):
        self.agent = agent  # shared by both replicas: requests count wherever they happen (acks of revokes)
        coords = {d: int(c) for d, c in config.layout().coords(rank).items()}
        self.config, self.groups = config, groups
        self.stage, self.tp_rank, self.dp_rank = coords[Dim.PP], coords[Dim.TP], coords[Dim.DP]
        self.model = _Stage(config, self.stage, self.tp_rank, groups[Dim.TP])
        self.params = list(self.model.parameters())
        self.optimizer = _Adam(self.params, config.lr)
        self.losses, self.times, self.requests = [], [], []

    def step(self, step: int) -> None:
        start, sent = time.perf_counter(), self._requests()
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

    def result(self, rank: int) -> dict:
        controller = idle_stats() if self.agent is None else self.agent.stats()  # none on plain gloo
        controller["requests_per_step"] = self.requests
        return {"rank": rank, "stage": self.stage, "tp_rank": self.tp_rank, "dp_rank": self.dp_rank,
                "losses": self.losses, "loss_bits": [_bits(x) for x in self.losses], "iteration_s": self.times,
                "controller": controller}


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
             pg_options: Any = None, baseline: str | None = None, block: int = 5) -> DemoRun:
    """Train ``config`` on ``config.world`` spawned CPU processes over ``backend``; aggregate the results.

    ``init`` (picklable, no arguments) runs in every worker before the default group exists, e.g.
    to register ``backend`` (``functools.partial(torch_backend.setup, backend_config)``: its agent
    reaches :func:`train_worker` as ``context``). The losses come from the last stage's first rank,
    with whether every last-stage rank reported the same bits; the per-step time is the slowest
    rank's, and its median leaves out the first (warm-up) step.

    With ``baseline``, a replica also trains on that backend in the same processes, in alternating
    blocks of ``block`` steps (see :func:`train_worker`); both medians leave out the first step of
    every block (the first one after a switch of backend finds the fabric as the other replica's
    block left it).
    """
    results = run_processes(train_worker, config.world, config, baseline, block, backend=backend, init=init,
                            pg_options=pg_options)
    skip = set(range(0, config.steps, block)) if baseline else {0}
    return DemoRun(config, config.world, _aggregate(config, backend, results, skip), tuple(results),
                   _aggregate(config, baseline, [r["baseline"] for r in results], skip) if baseline else None)


def _aggregate(config: DemoConfig, backend: str, results: list[dict], skip: set[int]) -> ReplicaRun:
    reporters = [r for r in results if r["stage"] == config.pp - 1]
    first = reporters[0]
    per_step = [max(r["iteration_s"][s] for r in results) for s in range(config.steps)]
    kept = [t for s, t in enumerate(per_step) if s not in skip] or per_step
    return ReplicaRun(backend, tuple(first["losses"]), tuple(first["loss_bits"]),
                      all(r["loss_bits"] == first["loss_bits"] for r in reporters), tuple(per_step),
                      statistics.median(kept))
