"""A schedule: steps of transfers, stored as flat arrays (CSR by step).

Each transfer moves one chunk from ``src`` to ``dst`` and, by its :class:`Combine`, either
overwrites the destination's copy (``COPY``) or adds into it (``REDUCE``). Transfers of one step
run concurrently and read the state at the start of the step. Bytes follow from the buffer size:
a transfer carries ``size / chunks_per_buffer`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from lightrail.collectives.collective import Collective, Kind
from lightrail.errors import VerificationError

__all__ = ["Combine", "Step", "Schedule", "ScheduleBuilder", "rotations"]


class Combine(IntEnum):
    """What a transfer does with the chunk at its destination (a program's ops are another thing:
    ``workload.program``)."""

    COPY = 0
    """Overwrite the destination's copy."""
    REDUCE = 1
    """Add into the destination's copy."""


class Step(NamedTuple):
    """One step's transfers (views into the schedule's arrays)."""

    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    combine: np.ndarray


@dataclass(frozen=True, eq=False)
class Schedule:
    """Transfers of a collective, step by step, as arrays.

    ``step_ptr[s]:step_ptr[s+1]`` indexes the transfers of step ``s`` in ``src``, ``dst``,
    ``chunk`` and ``combine`` (:class:`Combine` values). Build one with :class:`ScheduleBuilder`.
    """

    name: str
    collective: Collective
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    combine: np.ndarray
    step_ptr: np.ndarray
    params: dict = field(default_factory=dict)
    rotation: int = 0
    """If > 0, a claim the verifier checks: every step lists, for k = 0..n-1, the same transfers
    shifted by k ranks and by ``k * rotation`` chunks (rank rotation symmetry)."""

    def __post_init__(self):
        n, c = self.nranks, self.nchunks
        t = len(self.src)
        if not (len(self.dst) == len(self.chunk) == len(self.combine) == t) or self.step_ptr[-1] != t:
            raise VerificationError("transfer arrays differ in length")
        for name, arr, hi in (("src", self.src, n), ("dst", self.dst, n), ("chunk", self.chunk, c)):
            if t and (arr.min() < 0 or arr.max() >= hi):
                i = int(np.flatnonzero((arr < 0) | (arr >= hi))[0])
                raise VerificationError(f"{name}={int(arr[i])} is out of range 0..{hi - 1}", step=self.step_of(i))
        if t and np.any(self.src == self.dst):
            i = int(np.flatnonzero(self.src == self.dst)[0])
            raise VerificationError("a rank sends to itself", step=self.step_of(i),
                                    rank=int(self.src[i]), chunk=int(self.chunk[i]))
        for arr in (self.src, self.dst, self.chunk, self.combine, self.step_ptr):
            arr.flags.writeable = False

    @property
    def kind(self) -> Kind:
        return self.collective.kind

    @property
    def nranks(self) -> int:
        return self.collective.nranks

    @property
    def nchunks(self) -> int:
        return self.collective.nchunks

    @property
    def nsteps(self) -> int:
        return len(self.step_ptr) - 1

    @property
    def ntransfers(self) -> int:
        return len(self.src)

    def step(self, s: int) -> Step:
        a, b = self.step_ptr[s], self.step_ptr[s + 1]
        return Step(self.src[a:b], self.dst[a:b], self.chunk[a:b], self.combine[a:b])

    @property
    def steps(self):
        """Iterate over the steps as :class:`Step` views."""
        return (self.step(s) for s in range(self.nsteps))

    def step_of(self, transfer: int) -> int:
        """The step that transfer index ``transfer`` belongs to."""
        return int(np.searchsorted(self.step_ptr, transfer, side="right") - 1)

    def chunk_bytes(self, size: float) -> float:
        """Bytes per chunk when each rank's buffer holds ``size`` bytes."""
        return float(size) / self.collective.chunks_per_buffer

    def __repr__(self) -> str:
        return f"<Schedule {self.name}: {self.nsteps} steps, {self.ntransfers} transfers>"


@dataclass
class _Part:
    """Transfers added by one builder call; ``step`` is None when rows are already step-sorted."""

    step: np.ndarray | None
    counts: np.ndarray  # transfers per step index
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    combine: np.ndarray

    def __post_init__(self):
        if self.step is not None and len(self.step) > 1 and not np.any(self.step[1:] < self.step[:-1]):
            self.step = None  # rows already in step order
        nonzero = np.flatnonzero(self.counts)
        self.first, self.last = int(nonzero[0]), int(nonzero[-1])

    @property
    def sorted(self) -> bool:
        return self.step is None

    def steps(self) -> np.ndarray:
        if self.step is not None:
            return self.step
        return np.repeat(np.arange(len(self.counts), dtype=np.int32), self.counts)


def rotations(x: np.ndarray, n: int) -> np.ndarray:
    """``out[s, k, u] = (x[s, u] + k) % n`` for ranks ``x`` of shape (S, U), without a modulo pass."""
    window = np.lib.stride_tricks.sliding_window_view(np.tile(np.arange(n, dtype=np.int32), 2), n)
    out = window[x]  # (S, U, n): row r of the window is r, r+1, ..., r+n-1 (mod n)
    return out.transpose(0, 2, 1) if out.shape[1] > 1 else out.reshape(len(x), n, 1)


class ScheduleBuilder:
    """Collects transfers by step index, so concurrent sub-schedules can share steps.

    ``add(step, src, dst, chunk, combine)`` broadcasts its arguments; steps may be added in any order.
    ``add_rotations`` adds transfers together with all their rank rotations, which lets the
    verifier prove one block of chunks and conclude for all (see ``verify``).
    """

    def __init__(self, kind: Kind | str, nranks: int, nchunks: int, *, root: int = 0):
        self.collective = Collective(Kind(kind), nranks, nchunks, root)
        self._parts: list[_Part] = []
        self._rotated_steps: list[np.ndarray] = []
        self._plain = False

    @property
    def nsteps(self) -> int:
        return max((p.last + 1 for p in self._parts), default=0)

    def add_rotations(self, step, src, dst, chunk, combine: Combine) -> ScheduleBuilder:
        """Add transfers of chunks in block 0 (``chunk < nchunks / n``) and their n rotations.

        Arguments broadcast to shape (S, U): step S's U transfers, listed for k = 0..n-1 with
        ranks shifted by k and chunks by k blocks (k-major). Each step must come from one call.
        """
        n, c = self.collective.nranks, self.collective.nchunks
        step, src, dst, chunk = np.broadcast_arrays(*(np.atleast_2d(np.asarray(x, dtype=np.int32))
                                                      for x in (step, src, dst, chunk)))
        if chunk.size and (chunk.min() < 0 or chunk.max() >= c // n):
            raise ValueError("add_rotations takes chunks of block 0 (0 <= chunk < nchunks / nranks)")
        if step.size == 0:
            return self
        if np.any(step != step[:, :1]) or np.any(np.diff(step[:, 0]) <= 0):
            raise ValueError("add_rotations takes one row per step, in increasing step order")
        k = np.arange(n, dtype=np.int32)[None, :, None]
        src, dst = rotations(src % n, n), rotations(dst % n, n)
        chunk = chunk[:, None, :] + k * (c // n)
        self._rotated_steps.append(step[:, 0])
        counts = np.zeros(int(step.max()) + 1, np.int64)
        counts[step[:, 0]] = src.shape[1] * src.shape[2]
        self._parts.append(_Part(None, counts, src.ravel(), dst.ravel(), chunk.ravel(),
                                 np.full(src.size, int(combine), np.uint8)))
        return self

    def add(self, step, src, dst, chunk, combine: Combine) -> ScheduleBuilder:
        shape = np.broadcast_shapes(*(np.shape(x) for x in (step, src, dst, chunk)))
        size = int(np.prod(shape))
        if size:
            self._plain = True
            step, src, dst, chunk = (np.ascontiguousarray(np.broadcast_to(x, shape), dtype=np.int32).ravel()
                                     for x in (step, src, dst, chunk))
            if step.min() < 0:
                raise ValueError("steps are numbered from 0")
            self._parts.append(_Part(step, np.bincount(step), src, dst, chunk,
                                     np.full(size, int(combine), dtype=np.uint8)))
        return self

    def build(self, name: str, **params) -> Schedule:
        parts = self._parts
        nsteps = self.nsteps
        counts = np.zeros(nsteps, np.int64)
        for p in parts:
            counts[: len(p.counts)] += p.counts
        ordered = all(p.sorted for p in parts) and all(a.last < b.first for a, b in zip(parts, parts[1:], strict=False))
        if not parts:
            empty = np.zeros(0, np.int32)
            src, dst, chunk, combine = empty, empty, empty, np.zeros(0, np.uint8)
        elif ordered:
            src, dst, chunk, combine = (np.concatenate(a) if len(parts) > 1 else a[0]
                                        for a in zip(*((p.src, p.dst, p.chunk, p.combine) for p in parts),
                                                     strict=True))
        else:
            step = np.concatenate([p.steps() for p in parts])
            order = np.argsort(step, kind="stable")
            src, dst, chunk, combine = (np.concatenate(a)[order]
                                        for a in zip(*((p.src, p.dst, p.chunk, p.combine) for p in parts),
                                                     strict=True))
        step_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rotated = np.concatenate(self._rotated_steps) if self._rotated_steps else np.zeros(0, int)
        claim = (not self._plain and len(rotated) == len(np.unique(rotated))
                 and self.collective.kind in (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.ALLGATHER)
                 and self.collective.nchunks % self.collective.nranks == 0)
        rotation = self.collective.nchunks // self.collective.nranks if claim else 0
        self._parts, self._rotated_steps = [], []
        return Schedule(name, self.collective, src, dst, chunk, combine, step_ptr, dict(params), rotation)
