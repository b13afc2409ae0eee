"""Bytes an expert-parallel all-to-all moves: the one place the formulas live, in the core.

Pure integer arithmetic, no torch: the fabric model (``workload.model.ModelSpec.moe_alltoall_bytes``, used by
``workload.program`` for the EP all-to-all phases of ``lightrail simulate``), the MoE layer's byte counter
(``lightrail.moe.layer``) and the bench all call these (the MoE wing through :mod:`lightrail.moe.traffic`), so
the simulator's EP phases carry the bytes the layer actually sends.

Conventions (one MoE layer, one direction: dispatch; combine sends the same amount back):

- ``tokens`` is one rank's token count, each routed to ``topk`` experts; ``experts`` are sharded over
  ``ep`` ranks (expert ``e`` lives on rank ``e // (experts // ep)``).
- **payload** dispatch (FlashDMoE, arXiv 2506.04667): only routed tokens travel, ``tokens * topk`` rows of
  ``hidden * dtype_bytes`` bytes, and the rows whose expert lives on the sending rank stay local. Under
  uniform routing that is a fraction ``1/ep``; the layer counts the exact rows it sent.
- **padded** dispatch (GShard): every source rank sends ``experts x capacity`` slots, full or not, where
  ``capacity = ceil(capacity_factor * tokens * topk / experts)``; the ``experts / ep`` local experts' slots
  stay local. Rows over capacity are dropped (see ``lightrail.moe.layer.capacity_keep``).
- "on the wire" means sent to another rank: self-sends are never counted.
"""

from __future__ import annotations

import math

from lightrail.errors import ScenarioError

__all__ = ["DISPATCH_STYLES", "alltoall_buffer_bytes", "capacity", "padded_bytes", "payload_bytes"]

DISPATCH_STYLES = ("payload", "padded")
"""How tokens reach their experts: only routed tokens (``payload``) or capacity-padded slots (``padded``)."""


def _check(tokens: int, topk: int, hidden: int, dtype_bytes: int, ep: int) -> None:
    for name, value, low in (("tokens", tokens, 0), ("topk", topk, 1), ("hidden", hidden, 1),
                             ("dtype_bytes", dtype_bytes, 1), ("ep", ep, 1)):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise ScenarioError(f"{value!r} is not an integer >= {low}", field=name)


def capacity(tokens: int, topk: int, experts: int, capacity_factor: float) -> int:
    """Slots per expert per source rank: ``ceil(capacity_factor * tokens * topk / experts)``."""
    if not capacity_factor > 0:
        raise ScenarioError(f"capacity factor {capacity_factor!r} is not positive", field="capacity_factor",
                            fix="use e.g. 1.25")
    if experts < 1:
        raise ScenarioError(f"{experts} experts", field="experts", fix="use 1 or more")
    # round the product first so that e.g. 1.25 * 64 / 8 is exactly 10, not 10.000000000000002 -> 11
    return math.ceil(round(capacity_factor * tokens * topk / experts, 9))


def payload_bytes(tokens: int, topk: int, hidden: int, dtype_bytes: int, ep: int, *,
                  imbalance: float = 1.0) -> float:
    """Bytes one rank sends to other ranks in a payload-efficient dispatch under uniform routing:
    ``tokens * topk * (ep - 1) / ep`` rows (the ``1/ep`` routed to its own experts stay), times
    ``imbalance`` (the most loaded destination's share over the mean)."""
    _check(tokens, topk, hidden, dtype_bytes, ep)
    return tokens * topk * hidden * dtype_bytes * (ep - 1) / ep * imbalance


def padded_bytes(tokens: int, topk: int, hidden: int, dtype_bytes: int, ep: int, experts: int,
                 capacity_factor: float) -> int:
    """Bytes one rank sends to other ranks in a padded (GShard) dispatch: the ``experts * (ep - 1) / ep``
    remote experts' ``capacity`` slots each, full or not."""
    _check(tokens, topk, hidden, dtype_bytes, ep)
    if experts % ep:
        raise ScenarioError(f"{experts} experts do not split over ep={ep}", field="ep")
    remote_experts = experts // ep * (ep - 1)
    return remote_experts * capacity(tokens, topk, experts, capacity_factor) * hidden * dtype_bytes


def alltoall_buffer_bytes(style: str, tokens: int, topk: int, hidden: int, dtype_bytes: int, ep: int,
                          experts: int, *, capacity_factor: float = 1.0, imbalance: float = 1.0) -> float:
    """One rank's all-to-all buffer (its own chunk included), the fabric model's size of an EP all-to-all.

    The step-time engine cuts a buffer into ``ep`` equal chunks and sends the ``ep - 1`` others, so the
    bytes on the wire are ``(ep - 1) / ep`` of this, which is :func:`payload_bytes` or :func:`padded_bytes`.
    ``imbalance`` (max over mean rows per destination rank, >= 1) scales a payload buffer: the all-to-all
    finishes with its most loaded rank. A padded buffer is the same size however the tokens route.
    """
    if style not in DISPATCH_STYLES:
        raise ScenarioError(f"unknown dispatch style {style!r}", field="moe_dispatch",
                            fix="use " + " or ".join(DISPATCH_STYLES))
    if not imbalance >= 1:
        raise ScenarioError(f"imbalance {imbalance!r} is below 1", field="moe_imbalance",
                            fix="give max/mean rows per destination rank, 1 for uniform routing")
    _check(tokens, topk, hidden, dtype_bytes, ep)
    if style == "padded":
        return experts * capacity(tokens, topk, experts, capacity_factor) * hidden * dtype_bytes
    if imbalance == 1:
        return tokens * topk * hidden * dtype_bytes  # exact integer: the fabric model's historical figure
    return tokens * topk * hidden * dtype_bytes * imbalance
