"""Mixture-of-experts: an expert-parallel layer with payload-efficient, pipelined all-to-alls (FlashDMoE-style)
and the traffic formulas the fabric model shares with it.

``lightrail.moe.traffic`` is pure arithmetic (no torch): the byte formulas, which live in the core
(``lightrail.workload.moe_bytes``), and the layer's measured bytes; the layer (``lightrail.moe.layer``) and the
bench (``lightrail.moe.bench``) import torch and are loaded on use.
"""

from lightrail.moe.traffic import (
    DISPATCH_STYLES,
    alltoall_buffer_bytes,
    capacity,
    imbalance,
    measured_wire_bytes,
    padded_bytes,
    payload_bytes,
)

__all__ = ["DISPATCH_STYLES", "alltoall_buffer_bytes", "capacity", "imbalance", "measured_wire_bytes",
           "padded_bytes", "payload_bytes"]
