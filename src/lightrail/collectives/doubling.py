"""Recursive doubling and halving (and Rabenseifner's combination) for any rank count.

Non-powers of two use MPICH's fold (Thakur, Rabenseifner & Gropp 2005): with p the largest
power of two <= n and e = n - p, even ranks 2i < 2e first hand their data to rank 2i+1 and sit
out; the p remaining ranks ("virtual ranks") run the power-of-two algorithm; at the end rank
2i+1 hands the result back. Halving processes the lowest bit first, so every partial sum is a
contiguous block of ranks and the largest messages travel the shortest distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder

__all__ = ["Fold", "recursive_doubling_allreduce", "halving_doubling_allreduce",
           "recursive_halving_reduce_scatter", "recursive_doubling_allgather"]


@dataclass(frozen=True)
class Fold:
    """n ranks folded onto p = 2^floor(log2 n) virtual ranks."""

    n: int

    @property
    def p(self) -> int:
        return 1 << (self.n.bit_length() - 1)

    @property
    def extra(self) -> int:
        return self.n - self.p

    @property
    def real(self) -> np.ndarray:
        """Real rank of each virtual rank."""
        v = np.arange(self.p)
        return np.where(v < self.extra, 2 * v + 1, v + self.extra)

    @property
    def folded(self) -> np.ndarray:
        """Ranks that sit out (each hands over to ``folded + 1``)."""
        return 2 * np.arange(self.extra)

    def virtual_of(self, rank: np.ndarray) -> np.ndarray:
        """Virtual rank that stands for each real rank."""
        rank = np.asarray(rank)
        return np.where(rank < 2 * self.extra, rank // 2, rank - self.extra)

    @property
    def bits(self) -> list[int]:
        return [1 << k for k in range(self.p.bit_length() - 1)]


def _halving(b: ScheduleBuilder, step: int, fold: Fold, owner_v: np.ndarray) -> int:
    """Reduce-scatter among virtual ranks: virtual v ends with every chunk c with owner_v[c] == v."""
    v = np.arange(fold.p)
    for bit in fold.bits:  # lowest bit first
        u = v ^ bit
        send_v, chunk = np.nonzero(((owner_v[None, :] ^ u[:, None]) & (2 * bit - 1)) == 0)
        b.add(step, fold.real[send_v], fold.real[u[send_v]], chunk, Combine.REDUCE)
        step += 1
    return step


def _doubling(b: ScheduleBuilder, step: int, fold: Fold, owner_v: np.ndarray) -> int:
    """All-gather among virtual ranks: v starts with chunks owned by v, all end with all."""
    v = np.arange(fold.p)
    for bit in reversed(fold.bits):  # highest bit first: messages grow as distance shrinks
        send_v, chunk = np.nonzero(((owner_v[None, :] ^ v[:, None]) & (2 * bit - 1)) == 0)
        b.add(step, fold.real[send_v], fold.real[send_v ^ bit], chunk, Combine.COPY)
        step += 1
    return step


def _fold_in(b: ScheduleBuilder, fold: Fold, chunks: np.ndarray, combine: Combine) -> int:
    if not fold.extra:
        return 0
    b.add(0, fold.folded[:, None], fold.folded[:, None] + 1, chunks[None, :], combine)
    return 1


def _fold_out(b: ScheduleBuilder, step: int, fold: Fold, chunks: np.ndarray) -> None:
    if fold.extra:
        b.add(step, fold.folded[:, None] + 1, fold.folded[:, None], chunks[None, :], Combine.COPY)


@register(Kind.ALLREDUCE, "recursive-doubling", summary="exchange whole buffers with rank xor 2^k",
          steps="log2(p) (+2 if n is not a power of two; p = 2^floor(log2 n))")
def recursive_doubling_allreduce(n: int) -> Schedule:
    """Recursive-doubling AllReduce: log2(p) exchanges of the whole buffer.

    Notes
    -----
    Contention-free, n a power of two: ``log2(n)·(alpha + N/B)``.
    """
    fold = Fold(n)
    b = ScheduleBuilder(Kind.ALLREDUCE, n, 1)
    step = _fold_in(b, fold, np.zeros(1, int), Combine.REDUCE)
    v = np.arange(fold.p)
    for bit in fold.bits:
        b.add(step, fold.real[v], fold.real[v ^ bit], 0, Combine.REDUCE)
        step += 1
    _fold_out(b, step, fold, np.zeros(1, int))
    return b.build(f"recursive_doubling_allreduce(n={n})")


@register(Kind.ALLREDUCE, "halving-doubling",
          summary="Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather",
          steps="2 log2(p) (+2 if n is not a power of two)")
def halving_doubling_allreduce(n: int) -> Schedule:
    """Rabenseifner's AllReduce on p virtual chunks.

    Notes
    -----
    Contention-free, n a power of two: ``2·log2(n)·alpha + 2(n-1)/n · N/B``.
    """
    fold = Fold(n)
    chunks = np.arange(fold.p)
    b = ScheduleBuilder(Kind.ALLREDUCE, n, fold.p)
    step = _fold_in(b, fold, chunks, Combine.REDUCE)
    step = _halving(b, step, fold, chunks)
    step = _doubling(b, step, fold, chunks)
    _fold_out(b, step, fold, chunks)
    return b.build(f"halving_doubling_allreduce(n={n})")


@register(Kind.REDUCESCATTER, "recursive-halving", summary="exchange half of the remaining data with rank xor 2^k",
          steps="log2(p) (+2 if n is not a power of two)")
def recursive_halving_reduce_scatter(n: int) -> Schedule:
    fold = Fold(n)
    chunks = np.arange(n)
    b = ScheduleBuilder(Kind.REDUCESCATTER, n, n)
    step = _fold_in(b, fold, chunks, Combine.REDUCE)
    step = _halving(b, step, fold, fold.virtual_of(chunks))
    if fold.extra:  # hand each folded rank its own block
        b.add(step, fold.folded + 1, fold.folded, fold.folded, Combine.COPY)
    return b.build(f"recursive_halving_reducescatter(n={n})")


@register(Kind.ALLGATHER, "recursive-doubling", summary="exchange everything held with rank xor 2^k",
          steps="log2(p) (+2 if n is not a power of two)")
def recursive_doubling_allgather(n: int) -> Schedule:
    fold = Fold(n)
    chunks = np.arange(n)
    b = ScheduleBuilder(Kind.ALLGATHER, n, n)
    if fold.extra:
        b.add(0, fold.folded, fold.folded + 1, fold.folded, Combine.COPY)
    step = _doubling(b, 1 if fold.extra else 0, fold, fold.virtual_of(chunks))
    if fold.extra:  # everything but the folded rank's own block
        others = chunks[None, :] != fold.folded[:, None]
        rows, chunk = np.nonzero(others)
        b.add(step, fold.folded[rows] + 1, fold.folded[rows], chunk, Combine.COPY)
    return b.build(f"recursive_doubling_allgather(n={n})")
