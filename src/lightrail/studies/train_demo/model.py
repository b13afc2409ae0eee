"""The demo's GPT: Megatron-style tensor-parallel autograd functions (``_CopyToTP``, ``_ReduceFromTP``), a
transformer block with column- and row-parallel layers, and one pipeline stage of blocks.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightrail.studies.train_demo.config import DemoConfig, _normal


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
