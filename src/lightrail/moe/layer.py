"""An expert-parallel MoE layer on torch.distributed: payload-efficient, pipelined dispatch and combine.

FlashDMoE (arXiv 2506.04667) runs gate -> dispatch -> expert FFN -> combine in one persistent GPU kernel
with device-initiated, payload-efficient communication. On CPU/gloo this module reproduces the algorithmic
parts with three variants of the same layer (same gate, same experts, so the same outputs):

``payload`` (default)
    Each rank sends only the token rows actually routed to each peer's experts (a variable-split
    ``all_to_all_single``, no padding to capacity). Tokens are cut into ``tiles`` contiguous tiles and the
    communication is asynchronous: while tile i's experts compute, tile i+1's dispatch and tile i-1's
    combine are in flight (dispatch of tile i+2 is posted once tile i's combine is).
``unpipelined``
    The same payload-efficient exchange in one tile, each all-to-all waited for before the next step.
``padded``
    GShard: every source rank sends ``experts x capacity`` slots whether full or not, with
    ``capacity = ceil(capacity_factor * tokens * topk / experts)`` and ``tokens`` the largest local token
    count in the group; assignments over capacity are dropped (:func:`capacity_keep` gives the order).

Routing: ``probs = softmax(x @ gate_weight.T + gate_bias)``, each token goes to its ``topk`` most probable
experts with weight equal to that probability (not renormalised, as in Switch/GShard), and the layer's
output is ``sum_j weight_j * expert_j(x)``; an expert is ``gelu(x @ w1) @ w2``. Expert ``e`` lives on group
rank ``e // (experts // world)``. The gate is replicated (its gradient is each rank's share, to be summed
over the group like any data-parallel gradient); expert gradients are complete on the rank that owns them.

Autograd runs through the all-to-alls (:class:`_AllToAllStart`: the backward of a variable-split
all-to-all is the reverse all-to-all). Every rank builds the same graph whatever its token counts (empty
tiles and experts with no rows still run, on zero rows), so the collectives of the backward pass are
issued in the same order on every rank.

After each forward, ``layer.stats`` (:class:`RoutingStats`) holds what this rank sent and received and
the bytes it put on the wire (sends to other ranks only, counted by :mod:`lightrail.moe.traffic`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightrail.errors import ScenarioError
from lightrail.moe import traffic

__all__ = [
    "VARIANTS",
    "MoELayer",
    "ReferenceMoE",
    "RoutingStats",
    "capacity_keep",
    "check_sizes",
    "expert_ffn",
    "init_expert",
    "init_gate",
    "route",
]

VARIANTS = ("payload", "padded", "unpipelined")
"""The layer's dispatch variants (the bench's keys)."""


# ---- the math every variant and the reference share -------------------------------------------------------


def init_gate(hidden: int, experts: int, *, seed: int = 0, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate's weight [experts, hidden] and bias [experts] (zero), the same on every rank for a seed."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    weight = torch.randn(experts, hidden, generator=g, dtype=torch.float64) / math.sqrt(hidden)
    return weight.to(dtype), torch.zeros(experts, dtype=dtype)


def init_expert(e: int, hidden: int, ffn: int, *, seed: int = 0,
                dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``e``'s w1 [hidden, ffn] and w2 [ffn, hidden]: any rank can make any expert without the others."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 1009 * (e + 1))
    w1 = torch.randn(hidden, ffn, generator=g, dtype=torch.float32) / math.sqrt(hidden)
    w2 = torch.randn(ffn, hidden, generator=g, dtype=torch.float32) / math.sqrt(ffn)
    return w1.to(dtype), w2.to(dtype)


def expert_ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1) @ w2


def route(x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor, topk: int):
    """(weights, experts), each [tokens, topk]: the top-k softmax probabilities and their expert ids."""
    probs = torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1)
    return probs.topk(topk, dim=-1)


def capacity_keep(experts_of: torch.Tensor, num_experts: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GShard's drop rule on one source rank's assignments ``experts_of`` [tokens, topk].

    Assignments queue for their expert slot-major: every token's first choice in token order, then every
    token's second choice, and so on; the first ``cap`` in each expert's queue keep their place, the rest are
    dropped. Returns (keep [tokens, topk] bool, position in the expert's queue [tokens, topk])."""
    t, k = experts_of.shape
    flat = experts_of.t().reshape(-1)  # slot-major
    if flat.numel() == 0:
        empty = torch.zeros(t, k, dtype=torch.long)
        return empty.bool(), empty
    onehot = F.one_hot(flat, num_experts)
    pos = (onehot.cumsum(0) - 1).gather(1, flat[:, None])[:, 0]
    pos = pos.view(k, t).t()
    return pos < cap, pos


def check_sizes(*, world: int, experts: int, topk: int, hidden: int, ffn: int, tiles: int = 1,
                capacity_factor: float = 1.0) -> None:
    """The layer's size checks; each error names the argument (the CLI shows it as the flag)."""
    if world < 1:
        raise ScenarioError(f"{world} ranks", field="ranks", fix="use 1 or more ranks")
    for name, value in (("experts", experts), ("topk", topk), ("hidden", hidden), ("ffn", ffn), ("tiles", tiles)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(f"{value!r} is not a positive integer", field=name, fix="use 1 or more")
    if experts % world:
        raise ScenarioError(f"{experts} experts do not split over {world} ranks", field="ranks",
                            fix="use a rank count dividing the expert count")
    if topk > experts:
        raise ScenarioError(f"top-{topk} routing needs {topk} experts, there are {experts}", field="topk",
                            fix=f"use 1..{experts}")
    if not capacity_factor > 0:
        raise ScenarioError(f"capacity factor {capacity_factor!r} is not positive", field="capacity_factor",
                            fix="use e.g. 1.25")


# ---- the single-process reference ------------------------------------------------------------------------


class ReferenceMoE(nn.Module):
    """All experts in one process: the ground truth the distributed layer must equal.

    ``forward(x, chunks=..., capacity=...)``: with a capacity, ``x`` is the concatenation of the source
    ranks' tokens (``chunks`` rows each) and each chunk's assignments over capacity are dropped exactly as
    the padded layer drops them (:func:`capacity_keep`)."""

    def __init__(self, hidden: int, ffn: int, experts: int, topk: int, *, seed: int = 0, dtype=torch.float32,
                 gate_bias: torch.Tensor | None = None):
        super().__init__()
        check_sizes(world=1, experts=experts, topk=topk, hidden=hidden, ffn=ffn)
        self.hidden, self.ffn, self.experts, self.topk = hidden, ffn, experts, topk
        weight, bias = init_gate(hidden, experts, seed=seed, dtype=dtype)
        self.gate_weight = nn.Parameter(weight)
        self.gate_bias = nn.Parameter(bias if gate_bias is None else gate_bias.to(dtype).clone())
        w = [init_expert(e, hidden, ffn, seed=seed, dtype=dtype) for e in range(experts)]
        self.w1 = nn.Parameter(torch.stack([a for a, _ in w]))
        self.w2 = nn.Parameter(torch.stack([b for _, b in w]))

    def forward(self, x: torch.Tensor, *, chunks: list[int] | None = None, capacity: int | None = None):
        weights, experts_of = route(x, self.gate_weight, self.gate_bias, self.topk)
        keep = torch.ones_like(experts_of, dtype=torch.bool)
        if capacity is not None:
            sizes = chunks if chunks is not None else [x.shape[0]]
            keep = torch.cat([capacity_keep(part, self.experts, capacity)[0]
                              for part in experts_of.split(sizes)]) if x.shape[0] else keep
        out = torch.zeros_like(x)
        w1s, w2s = self.w1.unbind(0), self.w2.unbind(0)
        for e in range(self.experts):
            tok, slot = torch.nonzero((experts_of == e) & keep, as_tuple=True)
            y = expert_ffn(x[tok], w1s[e], w2s[e]) * weights[tok, slot][:, None]
            out = out.index_add(0, tok, y)
        return out


# ---- all-to-all with autograd, synchronous or started now and waited for later --------------------------


class _Pending:
    """An all-to-all in flight: its work handle and the send buffer it must keep alive."""

    def __init__(self):
        self.work = None
        self.keep = None


class _AllToAllStart(torch.autograd.Function):
    """Post a variable-split all-to-all; the result is valid once :class:`_AllToAllWait` returns it.

    Backward: the reverse all-to-all of the gradient (splits swapped), run synchronously."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, pending):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        send = x.contiguous()
        y = x.new_empty((sum(out_splits), *x.shape[1:]))
        pending.keep = send
        pending.work = dist.all_to_all_single(y, send, out_splits, in_splits, group=group, async_op=True)
        return y

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        grad = grad.contiguous()
        dx = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(dx, grad, in_splits, out_splits, group=ctx.group)
        return dx, None, None, None, None


class _AllToAllWait(torch.autograd.Function):
    """Wait for a posted all-to-all; identity for autograd."""

    @staticmethod
    def forward(ctx, y, pending):
        pending.work.wait()
        pending.keep = None
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _start(x, out_splits, in_splits, group) -> tuple[torch.Tensor, _Pending]:
    pending = _Pending()
    return _AllToAllStart.apply(x, list(out_splits), list(in_splits), group, pending), pending


def _wait(started: tuple[torch.Tensor, _Pending]) -> torch.Tensor:
    return _AllToAllWait.apply(*started)


# ---- the distributed layer ------------------------------------------------------------------------------


@dataclass
class RoutingStats:
    """What one rank's last forward routed (one direction; combine returns the same rows)."""

    variant: str
    rank: int
    rows_sent: list[int]
    """Rows this rank sent to each group rank in the dispatch (its own included; padded: slots)."""
    rows_received: int
    """Rows this rank's experts received (its own included; padded: slots)."""
    routed: int
    """Token-expert assignments made on this rank (tokens x topk)."""
    dropped: int = 0
    """Assignments dropped over capacity (padded only)."""
    capacity: int = 0
    """Slots per expert per source rank (padded only)."""
    row_bytes: int = 0
    metadata_bytes: int = 0
    """Bytes of routing metadata sent to other ranks (payload: the per-expert counts; padded: the max tokens)."""
    max_in_flight: int = 1
    """Most all-to-alls this rank had posted and not yet waited for at once (pipelining: 2 or more)."""
    bytes_on_wire: int = field(init=False)
    """Forward dispatch + combine bytes this rank sent to other ranks (payload rows only, no metadata)."""

    def __post_init__(self):
        self.bytes_on_wire = 2 * traffic.measured_wire_bytes(self.rows_sent, self.rank, self.row_bytes)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class MoELayer(nn.Module):
    """Top-k MoE layer with experts sharded over ``group`` (default: the world); see the module docstring.

    Parameters
    ----------
    hidden, ffn : model width and expert intermediate width.
    experts, topk : routed experts (a multiple of the group size) and experts per token.
    variant : ``payload``, ``padded`` or ``unpipelined``.
    tiles : token tiles of the pipelined payload variant (the others use one).
    capacity_factor : slots per expert over the uniform share (padded variant).
    seed, dtype, gate_bias : weights are those of ``ReferenceMoE(hidden, ffn, experts, topk, seed=seed, ...)``.
    """

    def __init__(self, hidden: int, ffn: int, experts: int, topk: int, *, variant: str = "payload", tiles: int = 4,
                 capacity_factor: float = 1.25, group: dist.ProcessGroup | None = None, seed: int = 0,
                 dtype=torch.float32, gate_bias: torch.Tensor | None = None):
        super().__init__()
        if variant not in VARIANTS:
            raise ScenarioError(f"unknown variant {variant!r}", field="variant", fix="use " + ", ".join(VARIANTS))
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        check_sizes(world=self.world, experts=experts, topk=topk, hidden=hidden, ffn=ffn, tiles=tiles,
                    capacity_factor=capacity_factor)
        self.hidden, self.ffn, self.experts, self.topk = hidden, ffn, experts, topk
        self.variant, self.tiles, self.capacity_factor = variant, tiles, capacity_factor
        self.local = experts // self.world
        weight, bias = init_gate(hidden, experts, seed=seed, dtype=dtype)
        self.gate_weight = nn.Parameter(weight)
        self.gate_bias = nn.Parameter(bias if gate_bias is None else gate_bias.to(dtype).clone())
        first = self.rank * self.local
        w = [init_expert(e, hidden, ffn, seed=seed, dtype=dtype) for e in range(first, first + self.local)]
        self.w1 = nn.Parameter(torch.stack([a for a, _ in w]))
        self.w2 = nn.Parameter(torch.stack([b for _, b in w]))
        self.stats: RoutingStats | None = None

    @property
    def first_expert(self) -> int:
        return self.rank * self.local

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ScenarioError(f"input of shape {tuple(x.shape)}", field="x", fix=f"give [tokens, {self.hidden}]")
        if self.variant == "padded":
            return self._padded(x)
        pipelined = self.variant == "payload"
        return self._payload(x, self.tiles if pipelined else 1, pipelined)

    # -- payload-efficient ---------------------------------------------------------------------------------

    def _local_experts(self, rows: torch.Tensor, counts: torch.Tensor, w1s, w2s) -> torch.Tensor:
        """Run the local experts (weights ``w1s[e]``, ``w2s[e]``) on received ``rows``, laid out [source rank]
        [local expert] by ``counts`` [world, local]; returns their outputs in the same row order. Runs every
        expert, on zero rows too."""
        eid = torch.arange(self.local).repeat(self.world).repeat_interleave(counts.reshape(-1))
        order = torch.argsort(eid, stable=True)
        per_expert = counts.sum(0).tolist()
        parts = rows[order].split(per_expert)
        ys = torch.cat([expert_ffn(p, w1s[e], w2s[e]) for e, p in enumerate(parts)])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        return ys[inverse]

    def _payload(self, x: torch.Tensor, tiles: int, pipelined: bool) -> torch.Tensor:
        world, local, k = self.world, self.local, self.topk
        weights, experts_of = route(x, self.gate_weight, self.gate_bias, k)
        # one view per expert for the whole forward: indexing self.w1[e] per tile would make the backward
        # materialise a full-size zero gradient per (tile, expert); unbind's backward stacks them once
        w1s, w2s = self.w1.unbind(0), self.w2.unbind(0)
        plans = []  # per tile: token of each row, its gate weight, in send order (sorted by expert)
        counts = torch.zeros(tiles, self.experts, dtype=torch.long)
        for i, span in enumerate(torch.arange(x.shape[0]).tensor_split(tiles)):
            tok = span.repeat_interleave(k)
            ex = experts_of[span].reshape(-1)
            order = torch.argsort(ex, stable=True)
            plans.append((tok[order], weights[span].reshape(-1)[order]))
            counts[i] = torch.bincount(ex, minlength=self.experts)
        # one metadata exchange: every tile's per-expert counts, [tiles, world, local] -> [source, tiles, local]
        send_meta = counts.view(tiles, world, local).transpose(0, 1).contiguous()
        recv_meta = torch.empty_like(send_meta)
        dist.all_to_all_single(recv_meta, send_meta, group=self.group)
        send_splits = counts.view(tiles, world, local).sum(2).tolist()  # [tile][dest]
        recv_splits = recv_meta.sum(2).t().tolist()  # [tile][source]

        live, peak = set(), 0

        def post(t, out_splits, in_splits):
            nonlocal peak
            started = _start(t, out_splits, in_splits, self.group)
            live.add(id(started[1]))
            peak = max(peak, len(live))
            return started

        def wait(started):
            live.discard(id(started[1]))
            return _wait(started)

        def dispatch(i):
            return post(x[plans[i][0]], recv_splits[i], send_splits[i])

        out = torch.zeros_like(x)

        def finish(i, started):
            nonlocal out
            back = wait(started)
            tok, w = plans[i]
            out = out.index_add(0, tok, back * w[:, None].to(back.dtype))

        if pipelined:
            # in flight at once: dispatch i+1 (and i+2 once combine i is posted), combine i-1
            inflight = {i: dispatch(i) for i in range(min(2, tiles))}
            combining = None
            for i in range(tiles):
                rows = wait(inflight.pop(i))
                ys = self._local_experts(rows, recv_meta[:, i, :], w1s, w2s)
                started = post(ys, send_splits[i], recv_splits[i])
                if i + 2 < tiles:
                    inflight[i + 2] = dispatch(i + 2)
                if combining is not None:
                    finish(*combining)
                combining = (i, started)
            finish(*combining)
        else:
            for i in range(tiles):
                rows = wait(dispatch(i))
                ys = self._local_experts(rows, recv_meta[:, i, :], w1s, w2s)
                finish(i, post(ys, send_splits[i], recv_splits[i]))
        rows_sent = [sum(s[d] for s in send_splits) for d in range(world)]
        self.stats = RoutingStats(self.variant, self.rank, rows_sent, int(recv_meta.sum()), int(experts_of.numel()),
                                  row_bytes=self.hidden * x.element_size(),
                                  metadata_bytes=(world - 1) * tiles * local * send_meta.element_size(),
                                  max_in_flight=peak)
        return out

    # -- padded (GShard) -----------------------------------------------------------------------------------

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        world, local, k, n_exp = self.world, self.local, self.topk, self.experts
        tokens = torch.tensor([x.shape[0]], dtype=torch.long)
        dist.all_reduce(tokens, op=dist.ReduceOp.MAX, group=self.group)  # capacity from the largest rank
        cap = traffic.capacity(int(tokens), k, n_exp, self.capacity_factor)
        weights, experts_of = route(x, self.gate_weight, self.gate_bias, k)
        keep, pos = capacity_keep(experts_of, n_exp, cap)
        tok = torch.arange(x.shape[0]).repeat_interleave(k)[keep.reshape(-1)]
        slot = (experts_of * cap + pos).reshape(-1)[keep.reshape(-1)]
        w = weights.reshape(-1)[keep.reshape(-1)]
        buf = x.new_zeros(n_exp * cap, self.hidden).index_copy(0, slot, x[tok])
        even = [local * cap] * world
        recv = _wait(_start(buf, even, even, self.group))  # [source, local, cap, hidden]
        h = recv.view(world, local, cap, self.hidden).transpose(0, 1).reshape(local, world * cap, self.hidden)
        ys = torch.bmm(F.gelu(torch.bmm(h, self.w1)), self.w2)
        ys = ys.view(local, world, cap, self.hidden).transpose(0, 1).reshape(world * local * cap, self.hidden)
        back = _wait(_start(ys, even, even, self.group))
        out = torch.zeros_like(x).index_add(0, tok, back[slot] * w[:, None])
        self.stats = RoutingStats(self.variant, self.rank, even, world * local * cap, int(experts_of.numel()),
                                  dropped=int((~keep).sum()), capacity=cap, row_bytes=self.hidden * x.element_size(),
                                  metadata_bytes=(world - 1) * tokens.element_size())
        return out
