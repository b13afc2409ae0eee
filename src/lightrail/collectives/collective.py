"""What a collective must achieve: pre- and postconditions over (rank, chunk, contributor).

Kept apart from how a schedule achieves it (msccl-tools' split of ``collectives.py`` and
``algorithm.py``). A rank's buffer is cut into chunks; the verifier tracks, for every
(rank, chunk), the set of ranks whose contribution that slot holds.

Chunk conventions (``nchunks`` = C):
- allreduce, broadcast, reduce: every rank's buffer is the C chunks.
- reducescatter: C = n*m; chunk c belongs to rank ``c // m`` (its output block).
- allgather: C = n*m; chunk c is contributed by rank ``c // m``.
- alltoall: C = n*n*m; chunk ``(i*n + j)*m + k`` travels from rank i to rank j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.defaults import Kind
from lightrail.errors import UnsupportedError

__all__ = ["Kind", "Collective", "FULL", "bus_factor"]

FULL = -1
"""Contributor value in a postcondition meaning "the reduction of all n ranks"."""


# Kind (the collectives: allreduce, reducescatter, ...) lives in lightrail.defaults, so the CLI's help lists
# them without importing numpy; re-exported here as collectives.collective.Kind and collectives.Kind.


def bus_factor(kind: Kind, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor (link load per byte of buffer)."""
    kind = Kind(kind)
    if kind is Kind.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if kind in (Kind.REDUCESCATTER, Kind.ALLGATHER, Kind.ALLTOALL):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Collective:
    """A collective on ``nranks`` ranks whose buffers are cut into ``nchunks`` chunks."""

    kind: Kind
    nranks: int
    nchunks: int
    root: int = 0

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        n, c = self.nranks, self.nchunks
        if n < 2:
            raise UnsupportedError(f"nranks={n} is too small", field="ranks", fix="use 2 or more ranks")
        unit = {Kind.REDUCESCATTER: n, Kind.ALLGATHER: n, Kind.ALLTOALL: n * n}.get(self.kind, 1)
        if c < 1 or c % unit:
            raise UnsupportedError(f"{self.kind} on {n} ranks needs a multiple of {unit} chunks, got {c}",
                                   field="nchunks")
        if not 0 <= self.root < n:
            raise UnsupportedError(f"root={self.root} is not a rank of {n}", field="root",
                                   fix=f"pick a root in 0..{n - 1}")

    @property
    def chunks_per_buffer(self) -> int:
        """Chunks in one rank's buffer (the unit that ``size`` is split into)."""
        return self.nchunks // self.nranks if self.kind is Kind.ALLTOALL else self.nchunks

    def owner(self) -> np.ndarray:
        """Per chunk, the rank it belongs to: output owner (reducescatter) or source (allgather, alltoall)."""
        n, c = self.nranks, self.nchunks
        chunk = np.arange(c)
        if self.kind in (Kind.REDUCESCATTER, Kind.ALLGATHER):
            return chunk // (c // n)
        if self.kind is Kind.ALLTOALL:
            return chunk // (c // n)
        return np.full(c, self.root)

    def pre(self, chunks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Initial holdings as arrays (rank, chunk, contributor): each slot holds one contribution.

        ``chunks`` restricts the answer to chunks ``0 .. chunks-1``.
        """
        n, c = self.nranks, self.nchunks if chunks is None else chunks
        if self.kind in (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.REDUCE):
            rank = np.repeat(np.arange(n), c)
            return rank, np.tile(np.arange(c), n), rank
        owner = self.owner()[:c]
        return owner, np.arange(c), owner

    def post(self, chunks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Required final holdings (rank, chunk, contributor); contributor ``FULL`` = all n reduced."""
        n, c = self.nranks, self.nchunks if chunks is None else chunks
        chunk = np.arange(c)
        if self.kind is Kind.ALLREDUCE:
            return np.repeat(np.arange(n), c), np.tile(chunk, n), np.full(n * c, FULL)
        if self.kind is Kind.REDUCESCATTER:
            return self.owner()[:c], chunk, np.full(c, FULL)
        if self.kind is Kind.REDUCE:
            return np.full(c, self.root), chunk, np.full(c, FULL)
        if self.kind is Kind.ALLTOALL:
            dest = chunk // (self.nchunks // (n * n)) % n
            return dest, chunk, self.owner()[:c]
        # allgather, broadcast: every rank ends with the owner's chunk
        return np.repeat(np.arange(n), c), np.tile(chunk, n), np.tile(self.owner()[:c], n)
