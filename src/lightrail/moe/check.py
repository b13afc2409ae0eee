"""Check the distributed MoE layer against the single-process reference: outputs and gradients.

:func:`run_case` runs in every rank of a process group (one case: variant, sizes, per-rank token counts,
gate bias) and returns this rank's output and gradients; :func:`compare` takes every rank's results,
runs :class:`~lightrail.moe.layer.ReferenceMoE` on the concatenated tokens (dropping, for the padded
variant, exactly what each source rank drops) and says what differs. Tests and the bench share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightrail.moe import traffic
from lightrail.moe.layer import MoELayer, ReferenceMoE

__all__ = ["Case", "run_case", "run_cases", "compare", "case_inputs"]


@dataclass(frozen=True)
class Case:
    variant: str
    tokens: tuple[int, ...]
    """Tokens on each rank (its length is the group size); a rank may have none."""
    experts: int
    topk: int
    hidden: int = 8
    ffn: int = 12
    tiles: int = 3
    capacity_factor: float = 1.25
    gate_bias: tuple[float, ...] | None = None
    """Added to the gate's logits: large negative values starve experts (uneven routing)."""
    seed: int = 0
    dtype: str = "float64"
    tags: tuple[str, ...] = field(default=())


def case_inputs(case: Case, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens and the output gradient it back-propagates (same in the reference)."""
    g = torch.Generator().manual_seed(case.seed * 7919 + rank)
    dtype = getattr(torch, case.dtype)
    x = torch.randn(case.tokens[rank], case.hidden, generator=g, dtype=torch.float64).to(dtype)
    gy = torch.randn(case.tokens[rank], case.hidden, generator=g, dtype=torch.float64).to(dtype)
    return x, gy


def _bias(case: Case):
    return None if case.gate_bias is None else torch.tensor(case.gate_bias, dtype=torch.float64)


def run_case(rank: int, case: Case) -> dict:
    """Forward and backward of one case on this rank (call it on every rank of the default group)."""
    dtype = getattr(torch, case.dtype)
    layer = MoELayer(case.hidden, case.ffn, case.experts, case.topk, variant=case.variant, tiles=case.tiles,
                     capacity_factor=case.capacity_factor, seed=case.seed, dtype=dtype, gate_bias=_bias(case))
    x, gy = case_inputs(case, rank)
    x.requires_grad_(True)
    out = layer(x)
    (out * gy).sum().backward()
    return {"out": out.detach(), "dx": x.grad, "dgate_w": layer.gate_weight.grad, "dgate_b": layer.gate_bias.grad,
            "dw1": layer.w1.grad, "dw2": layer.w2.grad, "stats": layer.stats.to_dict()}


def run_cases(rank: int, n: int, cases: list[Case]) -> list[dict]:
    """Every case in turn on this rank (a ``run_processes`` worker)."""
    torch.set_num_threads(1)
    return [run_case(rank, case) for case in cases]


def reference(case: Case) -> dict:
    """The single-process reference's output and gradients for a case."""
    dtype = getattr(torch, case.dtype)
    ref = ReferenceMoE(case.hidden, case.ffn, case.experts, case.topk, seed=case.seed, dtype=dtype,
                       gate_bias=_bias(case))
    inputs = [case_inputs(case, r) for r in range(len(case.tokens))]
    x = torch.cat([a for a, _ in inputs]).requires_grad_(True)
    gy = torch.cat([b for _, b in inputs])
    cap = None
    if case.variant == "padded":
        cap = traffic.capacity(max(case.tokens), case.topk, case.experts, case.capacity_factor)
    out = ref(x, chunks=list(case.tokens), capacity=cap)
    (out * gy).sum().backward()
    return {"out": out.detach(), "dx": x.grad, "dgate_w": ref.gate_weight.grad, "dgate_b": ref.gate_bias.grad,
            "dw1": ref.w1.grad, "dw2": ref.w2.grad}


def compare(case: Case, results: list[dict], *, rtol: float | None = None, atol: float | None = None) -> list[str]:
    """What differs between the ranks' results and the reference (empty: they match).

    Outputs and input gradients are compared row block by row block, gate gradients summed over ranks,
    expert gradients shard by shard (rank r owns experts ``r * E/R .. (r+1) * E/R - 1``)."""
    ref = reference(case)
    precise = case.dtype == "float64"
    rtol = rtol if rtol is not None else (1e-9 if precise else 1e-4)
    atol = atol if atol is not None else (1e-10 if precise else 1e-5)
    got = {
        "out": torch.cat([r["out"] for r in results]),
        "dx": torch.cat([r["dx"] for r in results]),
        "dgate_w": sum(r["dgate_w"] for r in results),
        "dgate_b": sum(r["dgate_b"] for r in results),
        "dw1": torch.cat([r["dw1"] for r in results]),
        "dw2": torch.cat([r["dw2"] for r in results]),
    }
    problems = []
    for key, want in ref.items():
        have = got[key]
        if have.shape != want.shape:
            problems.append(f"{key}: shape {tuple(have.shape)} != {tuple(want.shape)}")
        elif not torch.allclose(have, want, rtol=rtol, atol=atol):
            problems.append(f"{key}: max |diff| {float((have - want).abs().max()):.3g}")
    return problems
