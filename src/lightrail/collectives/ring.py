"""Ring collectives: every rank sends to its successor each step (bandwidth-optimal).

The ring helpers work on several disjoint rings at once (``groups``, one ring per row), each
moving blocks of chunks, so the hierarchical algorithm reuses them inside and across servers.
"""

from __future__ import annotations

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder

__all__ = ["ring_reduce_scatter_into", "ring_allgather_into", "ring_allreduce", "ring_reduce_scatter",
           "ring_allgather"]


def _ring_steps(b: ScheduleBuilder, step0: int, groups: np.ndarray, blocks: np.ndarray,
                shift: int, combine: Combine) -> int:
    """Member i of each ring sends block ``(i - s - shift) mod k`` to member i+1 at step s."""
    g, k = groups.shape
    m = blocks.shape[2]
    if k < 2:
        return step0
    s = np.arange(k - 1, dtype=np.int32)[:, None, None, None]
    if g == 1 and m == 1 and np.array_equal(groups[0], np.arange(b.collective.nranks)) \
            and np.array_equal(blocks[0, :, 0], groups[0]):
        # One ring over all ranks, block i = chunk i: the step is the rotations of chunk 0's transfer.
        first = (s[:, 0, 0, 0] + shift) % k  # the member that sends chunk 0 at step s
        b.add_rotations(step0 + s[:, :, 0, 0], first[:, None], (first[:, None] + 1) % k, 0, combine)
        return step0 + k - 1
    i = np.arange(k, dtype=np.int32)[None, None, :, None]
    blk = (i - s - shift) % k
    chunk = blocks[np.arange(g)[None, :, None, None], blk, np.arange(m)[None, None, None, :]]
    b.add(step0 + s, groups[None, :, :, None], np.roll(groups, -1, axis=1)[None, :, :, None], chunk, combine)
    return step0 + k - 1


def ring_reduce_scatter_into(b: ScheduleBuilder, step0: int, groups: np.ndarray, blocks: np.ndarray) -> int:
    """Ring reduce-scatter on each row of ``groups``: member i ends with block i reduced.

    ``blocks[g, i]`` lists the chunks of member i's block in ring g. Returns the next free step.
    """
    return _ring_steps(b, step0, groups, blocks, 1, Combine.REDUCE)


def ring_allgather_into(b: ScheduleBuilder, step0: int, groups: np.ndarray, blocks: np.ndarray) -> int:
    """Ring all-gather on each row of ``groups``: member i starts with block i, all end with all."""
    return _ring_steps(b, step0, groups, blocks, 0, Combine.COPY)


def _one_ring(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n)[None, :], np.arange(n).reshape(1, n, 1)


@register(Kind.ALLREDUCE, "ring", summary="reduce-scatter then all-gather around a ring",
          steps="2(n-1)", auto=True)
def ring_allreduce(n: int) -> Schedule:
    """Ring AllReduce (Patarasuk & Yuan 2009).

    Notes
    -----
    On a contention-free fabric of link bandwidth B: ``2(n-1)·alpha + 2(n-1)/n · N/B``.
    """
    b = ScheduleBuilder(Kind.ALLREDUCE, n, n)
    groups, blocks = _one_ring(n)
    step = ring_reduce_scatter_into(b, 0, groups, blocks)
    ring_allgather_into(b, step, groups, blocks)
    return b.build(f"ring_allreduce(n={n})")


@register(Kind.REDUCESCATTER, "ring", summary="partial sums travel n-1 hops around a ring",
          steps="n-1", auto=True)
def ring_reduce_scatter(n: int) -> Schedule:
    b = ScheduleBuilder(Kind.REDUCESCATTER, n, n)
    ring_reduce_scatter_into(b, 0, *_one_ring(n))
    return b.build(f"ring_reducescatter(n={n})")


@register(Kind.ALLGATHER, "ring", summary="each block travels n-1 hops around a ring", steps="n-1",
          auto=True)
def ring_allgather(n: int) -> Schedule:
    b = ScheduleBuilder(Kind.ALLGATHER, n, n)
    ring_allgather_into(b, 0, *_one_ring(n))
    return b.build(f"ring_allgather(n={n})")
