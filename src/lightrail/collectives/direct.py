"""Direct (one-shot) AllReduce: every rank sends its whole buffer to every other rank at once."""

from __future__ import annotations

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder

__all__ = ["direct_allreduce"]


@register(Kind.ALLREDUCE, "direct", summary="one step: all-to-all of whole buffers, each rank reduces",
          steps="1")
def direct_allreduce(n: int) -> Schedule:
    """One-shot AllReduce; on a switch its one step costs ``alpha + (n-1)·N/B`` (the NIC is the limit)."""
    b = ScheduleBuilder(Kind.ALLREDUCE, n, 1)
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    b.add(0, src, dst, 0, Combine.REDUCE)
    return b.build(f"direct_allreduce(n={n})")
