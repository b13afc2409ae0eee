"""Bytes an expert-parallel all-to-all moves, and what the MoE layer measured it sent.

The formulas (``capacity``, ``payload_bytes``, ``padded_bytes``, ``alltoall_buffer_bytes``, their conventions
and sources) live in the core, :mod:`lightrail.workload.moe_bytes`, which the fabric model reads; they are
re-exported here for the layer and the bench. This module adds what only a real layer has: the bytes it
actually put on the wire and how unevenly its tokens routed. "On the wire" means sent to another rank:
self-sends are never counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightrail.workload.moe_bytes import (
    DISPATCH_STYLES,
    alltoall_buffer_bytes,
    capacity,
    padded_bytes,
    payload_bytes,
)

__all__ = [
    "DISPATCH_STYLES",
    "capacity",
    "payload_bytes",
    "padded_bytes",
    "alltoall_buffer_bytes",
    "measured_wire_bytes",
    "imbalance",
]


def measured_wire_bytes(rows_to_rank: Sequence[int], rank: int, row_bytes: int) -> int:
    """Bytes a rank actually sent: rows it sent to each destination rank, its own excluded, times a row's bytes."""
    return sum(int(n) for r, n in enumerate(rows_to_rank) if r != rank) * int(row_bytes)


def imbalance(rows_per_rank: Sequence[int]) -> float:
    """Max over mean rows received per rank (1.0 when uniform, or when nothing was routed)."""
    rows = [int(n) for n in rows_per_rank]
    total = sum(rows)
    return max(rows) * len(rows) / total if total else 1.0
