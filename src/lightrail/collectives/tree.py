"""Tree collectives: NCCL's double binary tree AllReduce and binomial broadcast / reduce."""

from __future__ import annotations

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder
from lightrail.errors import UnsupportedError

__all__ = ["btree_parents", "double_binary_tree_allreduce", "binomial_broadcast", "binomial_reduce"]


def btree_parents(n: int) -> np.ndarray:
    """Parent of every rank in NCCL's in-order binary tree rooted at rank 0 (root's parent is -1).

    Rank r with lowest set bit ``bit`` hangs under ``(r ^ bit) | (bit << 1)``, or ``r ^ bit`` when
    that is out of range (nccl ``src/graph/trees.cc``, ``ncclGetBtree``). Leaves are the odd ranks.
    """
    r = np.arange(n)
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)
    up[0] = -1
    return up


def _second_tree(parents: np.ndarray) -> np.ndarray:
    """NCCL's second tree: the mirror image for even n, shifted by one rank for odd n."""
    n = len(parents)
    r = np.arange(n)
    if n % 2 == 0:
        p = parents[n - 1 - r]
        return np.where(p < 0, -1, n - 1 - p)
    p = parents[(r - 1) % n]
    return np.where(p < 0, -1, (p + 1) % n)


def _depth_height(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(parents)
    depth = np.zeros(n, int)
    anc = parents.copy()
    while np.any(anc >= 0):
        depth += anc >= 0
        anc = np.where(anc >= 0, parents[np.maximum(anc, 0)], -1)
    height = np.zeros(n, int)
    for d in range(int(depth.max()), 0, -1):
        level = np.flatnonzero(depth == d)
        np.maximum.at(height, parents[level], height[level] + 1)
    return depth, height


def _tree_into(b: ScheduleBuilder, parents: np.ndarray, chunks: np.ndarray) -> None:
    """Pipelined reduce to the root then broadcast down, chunk j one step behind chunk j-1."""
    depth, height = _depth_height(parents)
    root_height = int(height[parents < 0][0])
    kid = np.flatnonzero(parents >= 0)
    j = np.arange(len(chunks))[None, :]
    b.add(height[kid][:, None] + j, kid[:, None], parents[kid][:, None], chunks[None, :], Combine.REDUCE)
    b.add(root_height + j + depth[kid][:, None] - 1, parents[kid][:, None], kid[:, None], chunks[None, :],
          Combine.COPY)


@register(Kind.ALLREDUCE, "double-binary-tree",
          summary="NCCL double binary tree: each half reduced up and broadcast down its own tree",
          steps="height + depth + pipeline - 1 (about 2 log2 n)")
def double_binary_tree_allreduce(n: int, *, pipeline: int = 1) -> Schedule:
    """Double binary tree AllReduce (Sanders, Speck & Träff 2009; NCCL 2.4).

    Half the buffer goes through each tree. For even n every rank is an inner node of at most one
    tree (the mirror maps odd leaves onto even inner ranks); for odd n the shifted tree makes rank 0
    inner in both, as in NCCL. ``pipeline`` chunks per tree let a tree's levels work concurrently.
    """
    if pipeline < 1:
        raise UnsupportedError(f"pipeline={pipeline}", field="pipeline", fix="use 1 or more chunks per tree")
    b = ScheduleBuilder(Kind.ALLREDUCE, n, 2 * pipeline)
    first = btree_parents(n)
    _tree_into(b, first, np.arange(pipeline))
    _tree_into(b, _second_tree(first), pipeline + np.arange(pipeline))
    return b.build(f"double_binary_tree_allreduce(n={n},pipeline={pipeline})", pipeline=pipeline)


def _binomial_edges(n: int, root: int):
    """Per step k, (parent, child) pairs of the binomial tree: relative rank r sends to r + 2^k."""
    for k in range((n - 1).bit_length()):
        rel = np.arange(min(1 << k, n - (1 << k)))
        yield k, (rel + root) % n, (rel + (1 << k) + root) % n


@register(Kind.BROADCAST, "binomial-tree", summary="the set of holders doubles every step",
          steps="ceil(log2 n)", auto=True)
def binomial_broadcast(n: int, *, root: int = 0) -> Schedule:
    """Binomial-tree broadcast. Contention-free: ``ceil(log2 n)·(alpha + N/B)``."""
    b = ScheduleBuilder(Kind.BROADCAST, n, 1, root=root)
    for k, parent, child in _binomial_edges(n, root):
        b.add(k, parent, child, 0, Combine.COPY)
    return b.build(f"binomial_broadcast(n={n},root={root})", root=root)


@register(Kind.REDUCE, "binomial-tree", summary="partial sums combine pairwise towards the root",
          steps="ceil(log2 n)", auto=True)
def binomial_reduce(n: int, *, root: int = 0) -> Schedule:
    """Binomial-tree reduce (MPICH's order): at step k relative rank 2^k (mod 2^(k+1)) hands its
    partial sum, that of ranks rel .. rel + 2^k - 1, to rel - 2^k."""
    b = ScheduleBuilder(Kind.REDUCE, n, 1, root=root)
    for k in range((n - 1).bit_length()):
        rel = np.arange(1 << k, n, 2 << k)
        b.add(k, (rel + root) % n, (rel - (1 << k) + root) % n, 0, Combine.REDUCE)
    return b.build(f"binomial_reduce(n={n},root={root})", root=root)
