"""Pairwise all-to-all: at step s every rank sends its block for rank r + s directly."""

from __future__ import annotations

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder

__all__ = ["pairwise_alltoall"]


@register(Kind.ALLTOALL, "pairwise", summary="n-1 shifted permutations, each block sent directly",
          steps="n-1", auto=True)
def pairwise_alltoall(n: int) -> Schedule:
    """Pairwise-exchange all-to-all. Contention-free: ``(n-1)·(alpha + N/(n·B))``."""
    b = ScheduleBuilder(Kind.ALLTOALL, n, n * n)
    r = np.arange(n)[None, :]
    s = np.arange(1, n)[:, None]
    peer = (r + s) % n
    b.add(s - 1, r, peer, r * n + peer, Combine.COPY)
    return b.build(f"pairwise_alltoall(n={n})")
