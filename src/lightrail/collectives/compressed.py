"""Compressed schedules: a step is a pattern plus its parameters, not its transfers.

A ring AllReduce on n ranks lists 2(n-1)·n transfers, but each of its steps is the n rank rotations of
one transfer: the pattern "r sends to r+1" with a rank offset. A :class:`CompressedSchedule` stores the
few distinct :class:`Pattern` objects and, per step, which pattern it applies, with which parameter
and which :class:`Combine`. Its size is O(steps + patterns), so 65,536 ranks fit in a few megabytes.

Pattern kinds (``n`` ranks, block ``m = nchunks / n``):

- ``ROTATION``: block-0 transfers ``src0, dst0, chunk0`` (U of them, U independent of n) and all their
  n rank rotations. A step adds a rank offset ``shift``: for k = 0..n-1 (k-major, then u) the step
  lists ``((src0 + shift + k) % n, (dst0 + shift + k) % n, chunk0 + k·m)``, exactly what
  :meth:`ScheduleBuilder.add_rotations` lists. The pair multiset does not depend on ``shift``.
- ``XOR``: every rank v sends to ``v ^ mask`` the chunks ``c`` with ``(c & low) == ((v ^ sel) & low)``,
  in increasing v, then increasing c (recursive doubling and halving on a power of two).

Materialise the transfers only where a consumer needs them (:meth:`CompressedSchedule.expand`);
the engine times a compressed schedule from its patterns (``Engine.time_compressed``: one route and
one link-load pass per distinct pattern) and :func:`verify_compressed` proves rotation schedules from
their block 0, the argument ``verify`` makes for a ``Schedule.rotation`` claim. The PCCL and Opus planners
take each step's pairs from :func:`step_traffic`, computed once per pattern.

No compressed form, on purpose: the double binary tree (its explicit schedule is already linear, 4(n-1) transfers
per pipeline chunk, and ``verify`` proves it as trees in linear memory at large n). Left explicit for now: Bruck
all-to-all (about n^2 log2(n) / 2 transfers) and halving-doubling off powers of two (the fold, about 2n^2).

Builders register with :func:`register_compressed`; ``compressed_form(kind, name, n)`` returns the
compressed schedule, or None where the algorithm has no compressed builder for that n (then use the
explicit generator). ``expand()`` equals the explicit generator's schedule transfer for transfer
(tests check every n in 2..256).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from lightrail.catalog import parse_kind  # where it is defined: the registry imports this module (no circle)
from lightrail.collectives.collective import Collective, Kind
from lightrail.collectives.schedule import Combine, Schedule
from lightrail.errors import VerificationError

__all__ = ["PatternKind", "Pattern", "PatternStep", "CompressedSchedule", "register_compressed",
           "compressed_builder", "compressed_form", "verify_compressed", "step_traffic", "chunk_zero", "EXPAND_BELOW",
           "ring_allreduce_compressed",
           "ring_reduce_scatter_compressed", "ring_allgather_compressed", "halving_doubling_allreduce_compressed",
           "recursive_doubling_allreduce_compressed", "bruck_allgather_compressed", "bruck_reduce_scatter_compressed"]

_ROTATION_INVARIANT = (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.ALLGATHER)


class PatternKind(IntEnum):
    ROTATION = 0
    """Block-0 transfers and their n rank rotations (ranks +k, chunks +k blocks)."""
    XOR = 1
    """Every rank v sends to v ^ mask the chunks c with (c & low) == ((v ^ sel) & low)."""


def _ints(x) -> np.ndarray:
    a = np.atleast_1d(np.asarray(x, dtype=np.int64))
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Pattern:
    """One step shape on ``nranks`` ranks with ``nchunks`` chunks; see the module docstring."""

    kind: PatternKind
    nranks: int
    nchunks: int
    src: np.ndarray = field(default_factory=lambda: _ints([]))
    """ROTATION: block-0 senders (before the step's shift)."""
    dst: np.ndarray = field(default_factory=lambda: _ints([]))
    chunk: np.ndarray = field(default_factory=lambda: _ints([]))
    mask: int = 0
    sel: int = 0
    low: int = 0

    def __post_init__(self):
        n, c = self.nranks, self.nchunks
        if self.kind is PatternKind.ROTATION:
            for name in ("src", "dst", "chunk"):
                object.__setattr__(self, name, _ints(getattr(self, name)))
            if not len(self.src) == len(self.dst) == len(self.chunk):
                raise VerificationError("pattern arrays differ in length")
            if c % n or (len(self.chunk) and (self.chunk.min() < 0 or self.chunk.max() >= c // n)):
                raise VerificationError("a rotation pattern takes chunks of block 0 (0 <= chunk < nchunks / nranks)")
            if np.any((self.src - self.dst) % n == 0):
                raise VerificationError("a rank sends to itself")
        else:
            low = self.low
            if n & (n - 1) or not 0 < self.mask < n or low + 1 > c or c % (low + 1) or low & (low + 1):
                raise VerificationError("an XOR pattern needs a power-of-two n, 0 < mask < n and low = 2^j - 1 "
                                        "dividing the chunks")

    @property
    def per_rank(self) -> int:
        """Transfers per rank (per rotation for ROTATION)."""
        return len(self.src) if self.kind is PatternKind.ROTATION else self.nchunks // (self.low + 1)

    @property
    def ntransfers(self) -> int:
        return self.nranks * self.per_rank

    def transfers(self, shift: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The step's transfers (src, dst, chunk) as int32 arrays, in the explicit generators' order."""
        n = self.nranks
        if self.kind is PatternKind.ROTATION:
            k = np.arange(n, dtype=np.int64)[:, None]
            src = (self.src[None, :] + shift + k) % n
            dst = (self.dst[None, :] + shift + k) % n
            chunk = self.chunk[None, :] + k * (self.nchunks // n)
        else:
            v = np.arange(n, dtype=np.int64)[:, None]
            j = np.arange(self.per_rank, dtype=np.int64)[None, :]
            chunk = ((v ^ self.sel) & self.low) + j * (self.low + 1)
            src, dst = np.broadcast_to(v, chunk.shape), np.broadcast_to(v ^ self.mask, chunk.shape)
        return tuple(np.ascontiguousarray(a, dtype=np.int32).ravel() for a in (src, dst, chunk))

    @functools.cached_property
    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct (src, dst) rank pairs and the chunks each carries: O(n · distinct offsets)."""
        n = self.nranks
        r = np.arange(n, dtype=np.int64)
        if self.kind is PatternKind.XOR:
            return r, r ^ self.mask, np.full(n, float(self.per_rank))
        offsets, counts = np.unique((self.dst - self.src) % n, return_counts=True)
        src = np.tile(r, len(offsets))
        return src, (src + np.repeat(offsets, n)) % n, np.repeat(counts.astype(float), n)


class PatternStep(NamedTuple):
    """Step: which pattern, its parameter (ROTATION: rank shift) and its combine."""

    pattern: int
    shift: int
    combine: Combine


@dataclass(frozen=True, eq=False)
class CompressedSchedule:
    """A schedule stored as patterns: ``step_pattern[s]`` indexes ``patterns``, with ``step_shift[s]`` and
    ``step_combine[s]``. :meth:`expand` materialises the explicit :class:`Schedule`."""

    name: str
    collective: Collective
    patterns: tuple[Pattern, ...]
    step_pattern: np.ndarray
    step_shift: np.ndarray
    step_combine: np.ndarray
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("step_pattern", "step_shift", "step_combine"):
            a = np.asarray(getattr(self, name), dtype=np.int64)
            a.flags.writeable = False
            object.__setattr__(self, name, a)
        if not len(self.step_pattern) == len(self.step_shift) == len(self.step_combine):
            raise VerificationError("step arrays differ in length")
        if len(self.step_pattern) and (self.step_pattern.min() < 0 or self.step_pattern.max() >= len(self.patterns)):
            raise VerificationError("a step names a pattern that does not exist")
        if any(p.nranks != self.nranks or p.nchunks != self.nchunks for p in self.patterns):
            raise VerificationError("a pattern is for another rank or chunk count")

    kind = property(lambda self: self.collective.kind)
    nranks = property(lambda self: self.collective.nranks)
    nchunks = property(lambda self: self.collective.nchunks)

    @property
    def nsteps(self) -> int:
        return len(self.step_pattern)

    @property
    def step_counts(self) -> np.ndarray:
        """Transfers per step, computed from the patterns."""
        per = np.array([p.ntransfers for p in self.patterns], dtype=np.int64)
        return per[self.step_pattern] if len(per) else np.zeros(0, np.int64)

    @property
    def ntransfers(self) -> int:
        return int(self.step_counts.sum())

    @property
    def steps(self) -> Iterator[PatternStep]:
        return (PatternStep(int(p), int(k), Combine(int(c)))
                for p, k, c in zip(self.step_pattern, self.step_shift, self.step_combine, strict=True))

    @property
    def rotation(self) -> int:
        """The rotation claim the explicit schedule carries (``Schedule.rotation``)."""
        n, c = self.nranks, self.nchunks
        rotated = all(p.kind is PatternKind.ROTATION for p in self.patterns)
        return c // n if rotated and self.kind in _ROTATION_INVARIANT and c % n == 0 else 0

    def chunk_bytes(self, size: float) -> float:
        return float(size) / self.collective.chunks_per_buffer

    def step_pairs(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step ``s``'s distinct (src, dst) pairs and chunks per pair (cached per pattern)."""
        return self.patterns[int(self.step_pattern[s])].pairs

    def expand(self) -> Schedule:
        """The explicit schedule (all transfers): for small n, the executor, and the equivalence tests."""
        parts = [self.patterns[p].transfers(k) for p, k in zip(self.step_pattern, self.step_shift, strict=True)]
        counts = self.step_counts
        if parts:
            src, dst, chunk = (np.concatenate(a) for a in zip(*parts, strict=True))
        else:
            src = dst = chunk = np.zeros(0, np.int32)
        combine = np.repeat(self.step_combine.astype(np.uint8), counts)
        step_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return Schedule(self.name, self.collective, src, dst, chunk, combine, step_ptr, dict(self.params),
                        self.rotation)

    def block_zero(self) -> Schedule:
        """ROTATION schedules: the transfers of block-0 chunks only (U per step), as a Schedule."""
        if not self.rotation:
            raise ValueError("block_zero needs a rotation-only schedule of a rotation-invariant collective")
        n = self.nranks
        pats = [self.patterns[p] for p in self.step_pattern]
        counts = np.array([len(p.src) for p in pats], dtype=np.int64)
        shift = np.repeat(self.step_shift, counts)
        cat = (lambda xs: np.concatenate(xs)) if pats else (lambda xs: np.zeros(0, np.int64))
        src = ((cat([p.src for p in pats]) + shift) % n).astype(np.int32)
        dst = ((cat([p.dst for p in pats]) + shift) % n).astype(np.int32)
        chunk = cat([p.chunk for p in pats]).astype(np.int32)
        combine = np.repeat(self.step_combine.astype(np.uint8), counts)
        ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return Schedule(self.name, self.collective, src, dst, chunk, combine, ptr)

    def __repr__(self) -> str:
        return (f"<CompressedSchedule {self.name}: {self.nsteps} steps, {len(self.patterns)} patterns, "
                f"{self.ntransfers} transfers>")


EXPAND_BELOW = 2**18
"""XOR schedules with at most this many transfers (halving-doubling up to 256 ranks) are proven expanded (the
explicit path's proof and method string); larger ones by their XOR symmetry (``+xor``), so memory stays linear
in the ranks and halving-doubling at 1,024 ranks is proven in milliseconds instead of 0.3 s."""


def _xor_symmetric(cs: CompressedSchedule) -> bool:
    return (cs.nchunks == cs.nranks and cs.kind in _ROTATION_INVARIANT
            and all(p.kind is PatternKind.XOR for p in cs.patterns))


def chunk_zero(cs: CompressedSchedule) -> Schedule:
    """XOR schedules: the transfers of chunk 0 only (senders v with ``(v ^ sel) & low == 0``), as a Schedule."""
    n = cs.nranks
    parts = []
    for p in (cs.patterns[i] for i in cs.step_pattern):
        v = np.flatnonzero(((np.arange(n) ^ p.sel) & p.low) == 0)
        parts.append((v, v ^ p.mask))
    counts = np.array([len(v) for v, _ in parts], dtype=np.int64)
    src = np.concatenate([v for v, _ in parts]).astype(np.int32) if parts else np.zeros(0, np.int32)
    dst = np.concatenate([d for _, d in parts]).astype(np.int32) if parts else np.zeros(0, np.int32)
    combine = np.repeat(cs.step_combine.astype(np.uint8), counts)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Schedule(cs.name, cs.collective, src, dst, np.zeros(len(src), np.int32), combine, ptr)


def verify_compressed(cs: CompressedSchedule, *, expand_below: int = EXPAND_BELOW):
    """Prove a compressed schedule without materialising it where a symmetry allows.

    - Rotation schedules: block 0 alone, in O(steps · U). They are the n rank rotations of block 0 by
      construction and the collective is rotation-invariant: ``verify``'s rotation argument.
    - XOR schedules with one chunk per rank (halving-doubling on a power of two), when larger than
      ``expand_below`` transfers: chunk 0 alone. Every XOR pattern is invariant under
      ``(rank, chunk) -> (rank ^ t, chunk ^ t)``, chunks never mix, and allreduce / reducescatter /
      allgather are invariant under that relabelling, so chunk t's run is chunk 0's with ranks ^ t.
    - Otherwise: the expanded schedule, by :func:`verify`.
    """
    from lightrail.collectives.verify import Verification, _NotAnInterval, verify, verify_bitset, verify_interval

    if cs.rotation:
        target, chunks, how = cs.block_zero(), cs.rotation, "+rotation"
    elif _xor_symmetric(cs) and cs.ntransfers > expand_below:
        target, chunks, how = chunk_zero(cs), 1, "+xor"
    else:
        return verify(cs.expand())
    try:
        result = verify_interval(target, _chunks=chunks)
    except _NotAnInterval:
        result = verify_bitset(target, _chunks=chunks)
    return Verification(cs.name, str(cs.kind), cs.nranks, cs.nchunks, cs.nsteps, result.method + how)


def step_traffic(schedule: Schedule | CompressedSchedule) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Per step: its distinct (src, dst) pairs as sorted codes ``src * n + dst``, the chunks each pair carries,
    and an id that steps with identical traffic share (first-seen order): what planners price and wire.

    From a :class:`CompressedSchedule` each pattern's traffic is computed once, from its pairs, and every
    step that applies it gets the same arrays (a 65,536-rank ring: one pattern, 131,070 references); from an
    explicit :class:`Schedule`, step by step. Both give equal arrays for the same schedule (tests compare)."""
    n = schedule.nranks
    codes: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    ids: list[int] = []
    seen: dict[bytes, int] = {}
    if isinstance(schedule, CompressedSchedule):
        per_pattern = []
        for pattern in schedule.patterns:
            src, dst, weight = pattern.pairs
            pair = src * n + dst
            order = np.argsort(pair, kind="stable")
            c, w = pair[order], np.asarray(weight, float)[order]
            per_pattern.append((c, w, seen.setdefault(c.tobytes() + w.tobytes(), len(seen))))
        first: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for p in schedule.step_pattern:
            c, w, i = per_pattern[p]
            c, w = first.setdefault(i, (c, w))  # patterns with equal traffic share one pair of arrays
            codes.append(c)
            counts.append(w)
            ids.append(i)
        return codes, counts, ids
    shared: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for st in schedule.steps:
        c, k = np.unique(st.src.astype(np.int64) * n + st.dst, return_counts=True)
        w = k.astype(float)
        i = seen.setdefault(c.tobytes() + w.tobytes(), len(seen))
        c, w = shared.setdefault(i, (c, w))
        codes.append(c)
        counts.append(w)
        ids.append(i)
    return codes, counts, ids


# -- registry of compressed builders --------------------------------------------------------------------

_COMPRESSED: dict[tuple[Kind, str], Callable[[int], CompressedSchedule | None]] = {}


def register_compressed(kind: Kind | str, name: str):
    """Decorator: ``fn(n) -> CompressedSchedule | None`` is the compressed form of algorithm ``name``
    (None where it has none for that n). Registered algorithms are unaffected."""

    def wrap(fn):
        key = (Kind(kind), name)
        if key in _COMPRESSED:
            raise ValueError(f"{kind} {name!r} already has a compressed builder")
        _COMPRESSED[key] = fn
        return fn

    return wrap


def compressed_builder(kind: Kind | str, name: str) -> Callable[[int], CompressedSchedule | None] | None:
    return _COMPRESSED.get((parse_kind(kind), name))


def compressed_form(kind: Kind | str, name: str, n: int, **params) -> CompressedSchedule | None:
    """The compressed schedule of algorithm ``name`` on ``n`` ranks, or None (no builder, parameters it
    does not take, or an n it does not compress)."""
    build = compressed_builder(kind, name)
    if build is None or params or n < 2:
        return None
    return build(n)


# -- builders ---------------------------------------------------------------------------------------------

def _ring_part(n: int, step0: int, shift: int, combine: Combine):
    """Ring steps s = 0..n-2: member (s + shift) mod n sends chunk 0 to its successor, with all rotations."""
    s = np.arange(n - 1, dtype=np.int64)
    return s + step0, (s + shift) % n, np.full(n - 1, int(combine))


def _ring(kind: Kind, n: int, name: str, parts) -> CompressedSchedule:
    pattern = Pattern(PatternKind.ROTATION, n, n, [0], [1 % n], [0])
    shifts = np.concatenate([p[1] for p in parts])
    combine = np.concatenate([p[2] for p in parts])
    return CompressedSchedule(name, Collective(kind, n, n), (pattern,), np.zeros(len(shifts), np.int64),
                              shifts, combine)


@register_compressed(Kind.ALLREDUCE, "ring")
def ring_allreduce_compressed(n: int) -> CompressedSchedule:
    """``ring_allreduce(n)`` as one rotation pattern (r -> r+1) and 2(n-1) shifts."""
    return _ring(Kind.ALLREDUCE, n, f"ring_allreduce(n={n})",
                 [_ring_part(n, 0, 1, Combine.REDUCE), _ring_part(n, n - 1, 0, Combine.COPY)])


@register_compressed(Kind.REDUCESCATTER, "ring")
def ring_reduce_scatter_compressed(n: int) -> CompressedSchedule:
    return _ring(Kind.REDUCESCATTER, n, f"ring_reducescatter(n={n})", [_ring_part(n, 0, 1, Combine.REDUCE)])


@register_compressed(Kind.ALLGATHER, "ring")
def ring_allgather_compressed(n: int) -> CompressedSchedule:
    return _ring(Kind.ALLGATHER, n, f"ring_allgather(n={n})", [_ring_part(n, 0, 0, Combine.COPY)])


def _xor_schedule(kind: Kind, n: int, nchunks: int, name: str, steps) -> CompressedSchedule:
    patterns = tuple(Pattern(PatternKind.XOR, n, nchunks, mask=m, sel=s, low=lo) for m, s, lo, _ in steps)
    return CompressedSchedule(name, Collective(kind, n, nchunks), patterns, np.arange(len(steps)),
                              np.zeros(len(steps), np.int64), np.array([int(c) for *_, c in steps]))


@register_compressed(Kind.ALLREDUCE, "halving-doubling")
def halving_doubling_allreduce_compressed(n: int) -> CompressedSchedule | None:
    """``halving_doubling_allreduce(n)`` for a power-of-two n: 2 log2(n) XOR patterns."""
    if n & (n - 1):
        return None  # the fold's extra steps: use the explicit generator
    bits = [1 << k for k in range(n.bit_length() - 1)]
    halving = [(b, b, 2 * b - 1, Combine.REDUCE) for b in bits]  # lowest bit first
    doubling = [(b, 0, 2 * b - 1, Combine.COPY) for b in reversed(bits)]
    return _xor_schedule(Kind.ALLREDUCE, n, n, f"halving_doubling_allreduce(n={n})", halving + doubling)


@register_compressed(Kind.ALLREDUCE, "recursive-doubling")
def recursive_doubling_allreduce_compressed(n: int) -> CompressedSchedule | None:
    """``recursive_doubling_allreduce(n)`` for a power-of-two n: log2(n) XOR patterns of the whole buffer."""
    if n & (n - 1):
        return None
    steps = [(1 << k, 0, 0, Combine.REDUCE) for k in range(n.bit_length() - 1)]
    return _xor_schedule(Kind.ALLREDUCE, n, 1, f"recursive_doubling_allreduce(n={n})", steps)


def _bruck_shifts(n: int):
    for k in range((n - 1).bit_length()):
        d = 1 << k
        yield d, min(d, n - d)


def _rotations(kind: Kind, n: int, name: str, steps) -> CompressedSchedule:
    """One ROTATION pattern per step from (src0, dst0, chunk0, combine), no shift."""
    patterns = tuple(Pattern(PatternKind.ROTATION, n, n, s, d, c) for s, d, c, _ in steps)
    return CompressedSchedule(name, Collective(kind, n, n), patterns, np.arange(len(steps)),
                              np.zeros(len(steps), np.int64), np.array([int(c) for *_, c in steps]))


@register_compressed(Kind.ALLGATHER, "bruck")
def bruck_allgather_compressed(n: int) -> CompressedSchedule:
    """``bruck_allgather(n)``: step k is one rotation pattern of min(2^k, n - 2^k) transfers at distance -2^k."""
    steps = []
    for d, cnt in _bruck_shifts(n):
        i = np.arange(cnt)
        steps.append((-i % n, (-i - d) % n, np.zeros(cnt, np.int64), Combine.COPY))
    return _rotations(Kind.ALLGATHER, n, f"bruck_allgather(n={n})", steps)


@register_compressed(Kind.REDUCESCATTER, "bruck")
def bruck_reduce_scatter_compressed(n: int) -> CompressedSchedule:
    """``bruck_reduce_scatter(n)``: the all-gather's patterns reversed, with reductions."""
    steps = []
    for d, cnt in reversed(list(_bruck_shifts(n))):
        i = np.arange(cnt)
        steps.append(((-d - i) % n, -i % n, np.zeros(cnt, np.int64), Combine.REDUCE))
    return _rotations(Kind.REDUCESCATTER, n, f"bruck_reducescatter(n={n})", steps)
