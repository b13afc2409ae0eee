"""Bruck's algorithms (Bruck et al. 1997): ceil(log2 n) steps for any n, by cyclic shifts of 2^k."""

from __future__ import annotations

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder

__all__ = ["bruck_allgather", "bruck_reduce_scatter", "bruck_alltoall"]


def _shifts(n: int):
    """Per step k: distance d = 2^k and how many blocks travel, min(d, n - d)."""
    for k in range((n - 1).bit_length()):
        d = 1 << k
        yield k, d, min(d, n - d)


@register(Kind.ALLGATHER, "bruck", summary="rank r sends everything it has to r - 2^k",
          steps="ceil(log2 n)")
def bruck_allgather(n: int) -> Schedule:
    """Bruck all-gather: after step k rank r holds blocks r .. r + 2^(k+1) - 1 (mod n)."""
    b = ScheduleBuilder(Kind.ALLGATHER, n, n)
    for k, d, cnt in _shifts(n):
        i = np.arange(cnt)  # rank -i sends chunk 0 (its i-th block) to -i-d; all ranks do the rotation
        b.add_rotations(k, -i % n, (-i - d) % n, 0, Combine.COPY)
    return b.build(f"bruck_allgather(n={n})")


@register(Kind.REDUCESCATTER, "bruck", summary="Bruck all-gather run backwards with reductions",
          steps="ceil(log2 n)")
def bruck_reduce_scatter(n: int) -> Schedule:
    """Bruck reduce-scatter: the transpose of the all-gather, largest distance first."""
    b = ScheduleBuilder(Kind.REDUCESCATTER, n, n)
    shifts = list(_shifts(n))
    for step, (_, d, cnt) in enumerate(reversed(shifts)):
        i = np.arange(cnt)  # rank r adds chunks r+d .. r+d+cnt-1 into r+d; here those of chunk 0
        b.add_rotations(step, (-d - i) % n, -i % n, 0, Combine.REDUCE)
    return b.build(f"bruck_reducescatter(n={n})")


@register(Kind.ALLTOALL, "bruck", summary="blocks hop by 2^k when bit k of their offset is set",
          steps="ceil(log2 n)")
def bruck_alltoall(n: int) -> Schedule:
    """Bruck all-to-all: the block from i to j (offset o = j - i) moves 2^k at step k if bit k of o is set.

    Each step moves about n/2 blocks per rank, trading bandwidth for log2 n start-ups.
    """
    b = ScheduleBuilder(Kind.ALLTOALL, n, n * n)
    i, j = np.divmod(np.arange(n * n), n)
    offset = (j - i) % n
    for k, d, _ in _shifts(n):
        moving = (offset >> k) & 1 == 1
        src = (i[moving] + (offset[moving] & (d - 1))) % n
        b.add(k, src, (src + d) % n, (i * n + j)[moving], Combine.COPY)
    return b.build(f"bruck_alltoall(n={n})")
