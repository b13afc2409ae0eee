"""What the MoE layer measured it sent (moe/traffic.py), beside the core's formulas it re-exports."""

from __future__ import annotations

from lightrail.moe import traffic
from lightrail.workload import moe_bytes


def test_measured_bytes_exclude_self_and_imbalance():
    assert traffic.measured_wire_bytes([5, 3, 0, 2], 1, 10) == 70
    assert traffic.imbalance([10, 10, 10, 10]) == 1.0
    assert traffic.imbalance([40, 0, 0, 0]) == 4.0
    assert traffic.imbalance([0, 0]) == 1.0


def test_the_wing_reads_the_cores_formulas():
    """One place the formulas live: the MoE wing's names are the core's objects, not copies."""
    for name in moe_bytes.__all__:
        assert getattr(traffic, name) is getattr(moe_bytes, name), name
