"""Symbolic verifier: proves a schedule computes its collective, or names where it breaks.

The state is, per (rank, chunk), the set of ranks whose contribution the slot holds. The
schedule is executed on these sets: a copy replaces the destination's set with the source's,
a reduce adds the source's set to the destination's and must not count any rank twice. At the
end, every slot the collective's postcondition names must hold exactly the required set.

Two exact representations of the sets:
- *interval*: a cyclic interval ``[start, start+length) mod n`` per slot, two int32 arrays.
  Every generator in lightrail (rings, doubling, halving, trees, Bruck, hierarchical) only ever
  merges adjacent intervals, so this handles thousands of ranks in O(transfers).
- *bitset*: ``n`` bits per slot, chunk-batched to bound memory. The reference semantics; used
  whenever a reduce merges pieces that are not one contiguous interval (and to diagnose errors).
Both give the same answer; tests check that on random schedules.

Rotation symmetry: when a schedule claims (``Schedule.rotation``) that each step is the n rank
rotations of its block-0 transfers, the verifier checks that claim on the arrays and then proves
block 0 alone. That suffices: chunks never mix, the execution commutes with the rotation, and
allreduce / reducescatter / allgather are rotation-invariant, so block k's run is block 0's
shifted by k. This is what makes a 4,096-rank ring cheap to prove. (A fault found this way is
real, but it is block 0's first fault, not necessarily the first in (rank, chunk) order.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.collectives.collective import FULL, Kind
from lightrail.collectives.schedule import Combine, Schedule, rotations
from lightrail.errors import VerificationError

__all__ = ["Verification", "verify", "is_correct", "verify_bitset", "verify_interval", "verify_tree"]

_BITSET_BUDGET = 256 * 2**20  # bytes of bitset state per chunk batch


@dataclass(frozen=True)
class Verification:
    """Proof record: which schedule, which collective, which method proved it."""

    name: str
    kind: str
    nranks: int
    nchunks: int
    nsteps: int
    method: str


# Collectives whose pre- and postconditions map onto themselves under rank rotation.
_ROTATION_INVARIANT = (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.ALLGATHER)


class _NotAnInterval(Exception):
    """A reduce whose result is not one cyclic interval: hand over to the bitset verifier."""


def verify(schedule: Schedule) -> Verification:
    """Prove ``schedule`` computes its collective; raise :class:`VerificationError` otherwise.

    Examples
    --------
    >>> from lightrail.collectives import generate
    >>> verify(generate("allreduce", "ring", 5)).method
    'interval+rotation'
    """
    target, blocks, method = schedule, None, ""
    if schedule.rotation and schedule.kind in _ROTATION_INVARIANT and _rotation_holds(schedule):
        target, blocks, method = _block_zero(schedule), schedule.rotation, "+rotation"
    try:
        result = verify_interval(target, _chunks=blocks)
    except _NotAnInterval:
        result = None
        if _bitset_bytes(target, blocks) > TREE_ABOVE:
            try:
                result = verify_tree(target)
            except _NotATree:
                pass
        if result is None:
            result = verify_bitset(target, _chunks=blocks)
    return _record(schedule, result.method + method)


TREE_ABOVE = 16 * 2**20
"""Bitset state (bytes, all chunks) above which an AllReduce that is not an interval merge is first tried as
reduce-and-broadcast trees (:func:`verify_tree`, linear in the transfers): the double binary tree needs 16 MiB
of bitsets at 8,192 ranks, 64 MiB at 16,384 and 1 GiB at 65,536. Up to it the bitset proves it, as before."""


def _bitset_bytes(schedule: Schedule, chunks: int | None) -> int:
    n = schedule.nranks
    return n * ((n + 63) // 64) * 8 * (schedule.nchunks if chunks is None else chunks)


class _NotATree(Exception):
    """The schedule is not reduce-up-then-broadcast-down trees: hand over to the bitset verifier."""


def verify_tree(schedule: Schedule) -> Verification:
    """Prove an AllReduce whose every chunk is reduced up a spanning tree and copied back down, in
    O(transfers · log n) time and linear memory; raise ``_NotATree`` for any other shape (the bitset
    verifier then decides, and names the fault if there is one).

    Per chunk the checks are: every rank but one (the root) sends exactly one reduce, and following those
    sends from any rank reaches the root (a spanning tree, no cycle); a rank sends its reduce strictly after
    every reduce into it has landed; every rank but the root receives exactly one copy, no earlier than the
    step in which it sends its reduce; a copy's sender is the root after its last incoming reduce, or a rank
    whose own copy landed in an earlier step. Then, by induction over the steps, a rank's reduce carries
    exactly its subtree's contributions (subtrees are disjoint: nothing is counted twice), the root ends with
    all n, and every copy carries all n, after which nothing writes that slot again: the postcondition.
    """
    n, c = schedule.nranks, schedule.nchunks
    if schedule.kind is not Kind.ALLREDUCE or n < 2:
        raise _NotATree
    step = np.repeat(np.arange(schedule.nsteps, dtype=np.int64), np.diff(schedule.step_ptr))
    chunk = schedule.chunk.astype(np.int64)
    src, dst = schedule.src.astype(np.int64) + chunk * n, schedule.dst.astype(np.int64) + chunk * n  # slots
    red = schedule.combine == Combine.REDUCE
    r_src, r_dst, r_step = src[red], dst[red], step[red]
    c_src, c_dst, c_step = src[~red], dst[~red], step[~red]
    slots = n * c
    if len(r_src) != (n - 1) * c or len(c_src) != (n - 1) * c:
        raise _NotATree
    sent = np.bincount(r_src, minlength=slots)
    got = np.bincount(c_dst, minlength=slots)
    if sent.max() > 1 or got.max() > 1:
        raise _NotATree
    root = np.flatnonzero(sent == 0)  # one per chunk: (n-1)c distinct senders among nc slots
    if np.any(root // n != np.arange(c)) or np.any(got[root]):
        raise _NotATree
    parent = np.arange(slots)
    parent[r_src] = r_dst  # the roots point at themselves
    for _ in range(max(1, (n - 1).bit_length()) + 1):  # pointer jumping: 2^k >= n hops reach the root
        parent = parent[parent]
    if np.any(parent != np.repeat(root, n)):
        raise _NotATree  # a cycle, or a rank whose sends never reach its chunk's root
    send_step = np.full(slots, np.iinfo(np.int64).max)
    send_step[r_src] = r_step  # the roots never send: "infinitely late"
    last_in = np.full(slots, -1)
    np.maximum.at(last_in, r_dst, r_step)
    if np.any(last_in >= send_step):
        raise _NotATree  # a rank sends before all its children's partial sums have landed
    copy_in = np.full(slots, -1)
    copy_in[c_dst] = c_step
    copy_in[root] = last_in[root]  # the root holds the full sum after its last incoming reduce
    if np.any(copy_in[c_dst] < send_step[c_dst]) or np.any(c_step <= copy_in[c_src]):
        raise _NotATree  # a copy overwrites a partial sum not yet sent, or comes from a rank not yet full
    return _record(schedule, "tree")


def _rotation_holds(schedule: Schedule) -> bool:
    """Check the claim: step s lists its block-0 transfers, then each rotation by k = 1..n-1."""
    n, c, m = schedule.nranks, schedule.nchunks, schedule.rotation
    counts = np.diff(schedule.step_ptr)
    if np.any(counts % n) or c != n * m:
        return False
    arrays = (schedule.src, schedule.dst, schedule.chunk, schedule.combine)
    if len(counts) and np.all(counts == counts[0]):  # uniform steps: one reshape does it
        u = int(counts[0]) // n
        src, dst, chunk, combine = (a.reshape(len(counts), n, u) for a in arrays)
        k = np.arange(n, dtype=np.int32)[None, :, None]
        return bool(np.all(chunk[:, 0] < m) and np.array_equal(chunk, chunk[:, :1] + k * m)
                    and all(np.array_equal(x, rotations(x[:, 0, :], n)) for x in (src, dst))
                    and np.all(combine == combine[:, :1]))
    step = np.repeat(np.arange(len(counts)), counts)
    u = (counts // n)[step]
    pos = np.arange(schedule.ntransfers) - schedule.step_ptr[step]
    k = (pos // u).astype(np.int32)
    base = schedule.step_ptr[step] + pos % u
    src, dst, chunk, combine = arrays
    return bool(np.all(chunk[base] < m) and np.array_equal(src, (src[base] + k) % n)
                and np.array_equal(dst, (dst[base] + k) % n)
                and np.array_equal(chunk, chunk[base] + k * m) and np.array_equal(combine, combine[base]))


def _block_zero(schedule: Schedule) -> Schedule:
    """The transfers of chunks in block 0: the first 1/n of every step."""
    counts = np.diff(schedule.step_ptr) // schedule.nranks
    step = np.repeat(np.arange(len(counts)), counts)
    take = schedule.step_ptr[step] + np.arange(len(step)) - np.repeat(np.cumsum(counts) - counts, counts)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    return Schedule(schedule.name, schedule.collective, schedule.src[take], schedule.dst[take],
                    schedule.chunk[take], schedule.combine[take], ptr)


def is_correct(schedule: Schedule) -> bool:
    """True when :func:`verify` proves the schedule, False when it finds a fault."""
    try:
        verify(schedule)
    except VerificationError:
        return False
    return True


def _record(schedule: Schedule, method: str) -> Verification:
    return Verification(schedule.name, str(schedule.kind), schedule.nranks, schedule.nchunks,
                        schedule.nsteps, method)


def _first_empty_send(holds: np.ndarray, src, chunk, s: int) -> None:
    bad = np.flatnonzero(~holds)
    if len(bad):
        i = int(bad[0])
        raise VerificationError(f"rank {int(src[i])} sends chunk {int(chunk[i])} before holding any of it",
                                step=s, rank=int(src[i]), chunk=int(chunk[i]))


def _write_conflicts(flat_dst: np.ndarray, combine: np.ndarray, s: int, nchunks: int, dst=None, chunk=None):
    """Group a step's transfers by destination slot; refuse a copy that shares its slot.

    Returns (order, occurrence): transfers sorted by slot, and each one's index within its slot.
    """
    order = np.argsort(flat_dst, kind="stable")
    slots = flat_dst[order]
    first = np.ones(len(slots), bool)
    first[1:] = slots[1:] != slots[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(slots)), 0))
    occurrence = np.arange(len(slots)) - group_start
    shared = ~(first & np.append(first[1:], True))  # slot written by more than one transfer
    bad = np.flatnonzero(shared & (combine[order] == Combine.COPY))
    if len(bad):
        i = int(order[bad[0]])
        rank, ch = (int(dst[i]), int(chunk[i])) if dst is not None else divmod(int(flat_dst[i]), nchunks)
        raise VerificationError("a copy and another transfer write the same slot in one step",
                                step=s, rank=rank, chunk=ch,
                                fix="give each destination slot one copy per step, or make them reduces")
    return order, occurrence


def _describe(members: np.ndarray, n: int) -> str:
    if len(members) == n:
        return f"all {n} ranks"
    if len(members) == 0:
        return "nothing"
    shown = ", ".join(str(int(m)) for m in members[:8])
    return f"ranks {{{shown}{', ...' if len(members) > 8 else ''}}} ({len(members)} of {n})"


def _slots(schedule: Schedule, *flat: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """Number the (rank, chunk) slots in use: densely (rank*C + chunk) unless that wastes memory.

    All-to-all touches n^2 of its n^3 slots, so there the used slots are numbered compactly.
    """
    n, c = schedule.nranks, schedule.nchunks
    if n * c <= 4 * sum(len(f) for f in flat):
        return n * c, list(flat)
    used = np.sort(np.concatenate(flat))
    used = used[np.append(True, used[1:] != used[:-1])]
    return len(used), [np.searchsorted(used, f) for f in flat]


def _conditions(schedule: Schedule, chunks: int | None):
    """Pre- and postcondition arrays, restricted to chunks below ``chunks`` when given."""
    return schedule.collective.pre(chunks), schedule.collective.post(chunks)


def verify_interval(schedule: Schedule, *, _chunks: int | None = None) -> Verification:
    """Interval-set verifier; raises ``_NotAnInterval`` if a merge leaves the representation."""
    n, c = schedule.nranks, schedule.nchunks
    (pre_rank, pre_chunk, pre_who), (post_rank, post_chunk, want) = _conditions(schedule, _chunks)
    nslots, (pre_slot, post_slot, src_slot, dst_slot) = _slots(
        schedule, pre_rank * c + pre_chunk, post_rank * c + post_chunk,
        schedule.src.astype(np.int64) * c + schedule.chunk, schedule.dst.astype(np.int64) * c + schedule.chunk)
    start = np.zeros(nslots, np.int32)
    length = np.zeros(nslots, np.int32)
    start[pre_slot] = pre_who
    length[pre_slot] = 1
    if schedule.ntransfers <= _SCALAR_PER_STEP * schedule.nsteps:
        _interval_scalar(schedule, n, c, start, length, src_slot, dst_slot)
    else:
        _interval_arrays(schedule, n, c, start, length, src_slot, dst_slot, nslots)
    rank, chunk = post_rank, post_chunk
    got_start, got_len = start[post_slot], length[post_slot]
    good = np.where(want == FULL, got_len == n, (got_len == 1) & (got_start == want))  # full: any start
    bad = np.flatnonzero(~good)
    if len(bad):
        i = int(bad[0])
        held = (int(got_start[i]) + np.arange(int(got_len[i]))) % n
        need = "the reduction of all ranks" if want[i] == FULL else f"rank {int(want[i])}'s chunk"
        raise VerificationError(f"ends holding {_describe(np.sort(held), n)}, needs {need}",
                                step=schedule.nsteps, rank=int(rank[i]), chunk=int(chunk[i]))
    return _record(schedule, "interval")


_SCALAR_PER_STEP = 2
"""Schedules with at most this many transfers per step on average (a ring's block 0: one) run the interval
verifier on Python scalars: numpy's per-call cost would dominate (131,070 one-transfer steps at 65,536 ranks)."""


def _interval_arrays(schedule: Schedule, n: int, c: int, start, length, src_slot, dst_slot, nslots: int) -> None:
    """The interval run, step by step on arrays (updates ``start`` and ``length`` in place)."""
    stamp = np.full(nslots, -1, np.int64)
    index = np.arange(schedule.ntransfers)
    ptr = schedule.step_ptr
    reduces_before = np.concatenate([[0], np.cumsum(schedule.combine, dtype=np.int64)])
    nreduce = reduces_before[ptr[1:]] - reduces_before[ptr[:-1]]
    for s in range(schedule.nsteps):
        a, z = ptr[s], ptr[s + 1]
        if a == z:
            continue
        fsrc, fdst = src_slot[a:z], dst_slot[a:z]
        s_start, s_len = start[fsrc], length[fsrc]
        if not s_len.all():
            _first_empty_send(s_len > 0, schedule.src[a:z], schedule.chunk[a:z], s)
        stamp[fdst] = index[a:z]
        if np.any(stamp[fdst] != index[a:z]):  # several transfers into one slot
            _write_conflicts(dst_slot[a:z], schedule.combine[a:z], s, c, schedule.dst[a:z], schedule.chunk[a:z])
            raise _NotAnInterval  # multi-way reduces: the bitset verifier merges them exactly
        if nreduce[s] == 0:  # copies only
            start[fdst] = s_start
            length[fdst] = s_len
            continue
        red = schedule.combine[a:z] == Combine.REDUCE
        d_start, d_len = start[fdst], length[fdst]
        total = d_len + s_len
        after_dst = (d_start + d_len) % n == s_start
        ok = (d_len == 0) | ((after_dst | ((s_start + s_len) % n == d_start)) & (total <= n))
        if nreduce[s] == z - a:  # reductions only
            if not ok.all():
                raise _NotAnInterval
            start[fdst] = np.where(after_dst & (d_len > 0), d_start, s_start)
            length[fdst] = total
            continue
        if not np.all(ok | ~red):
            raise _NotAnInterval
        start[fdst] = np.where(red & (d_len > 0) & after_dst, d_start, s_start)
        length[fdst] = np.where(red, total, s_len)


def _interval_scalar(schedule: Schedule, n: int, c: int, start, length, src_slot, dst_slot) -> None:
    """:func:`_interval_arrays` on Python scalars, transfer by transfer: the same checks in the same order
    (faults are reported by the array code, on the failing step), for schedules of tiny steps."""
    ptr = schedule.step_ptr.tolist()
    srcs, dsts, combines = src_slot.tolist(), dst_slot.tolist(), schedule.combine.tolist()
    st, ln = start.tolist(), length.tolist()
    reduce = int(Combine.REDUCE)
    for s in range(schedule.nsteps):
        a, z = ptr[s], ptr[s + 1]
        if z - a == 1:  # one transfer (a ring's block 0): no write conflict possible, the same rules inline
            f, d = srcs[a], dsts[a]
            s_start, s_len = st[f], ln[f]
            if not s_len:
                _first_empty_send(np.zeros(1, bool), schedule.src[a:z], schedule.chunk[a:z], s)
            d_len = ln[d]
            if combines[a] != reduce or not d_len:
                st[d], ln[d] = s_start, s_len
                continue
            d_start, total = st[d], d_len + s_len
            after_dst = (d_start + d_len) % n == s_start
            if total > n or not (after_dst or (s_start + s_len) % n == d_start):
                raise _NotAnInterval
            st[d], ln[d] = (d_start if after_dst else s_start), total
            continue
        if a == z:
            continue
        fsrc, fdst = srcs[a:z], dsts[a:z]
        reads = [(st[i], ln[i]) for i in fsrc]
        if not all(r[1] for r in reads):
            _first_empty_send(np.array([r[1] > 0 for r in reads]), schedule.src[a:z], schedule.chunk[a:z], s)
        if len(set(fdst)) < len(fdst):  # several transfers into one slot
            _write_conflicts(dst_slot[a:z], schedule.combine[a:z], s, c, schedule.dst[a:z], schedule.chunk[a:z])
            raise _NotAnInterval
        new = []
        for (s_start, s_len), d, op in zip(reads, fdst, combines[a:z], strict=True):
            if op != reduce:
                new.append((d, s_start, s_len))
                continue
            d_start, d_len = st[d], ln[d]
            if d_len == 0:
                new.append((d, s_start, s_len))
                continue
            total = d_len + s_len
            after_dst = (d_start + d_len) % n == s_start
            if total > n or not (after_dst or (s_start + s_len) % n == d_start):
                raise _NotAnInterval
            new.append((d, d_start if after_dst else s_start, total))
        for d, v_start, v_len in new:
            st[d], ln[d] = v_start, v_len
    start[:] = st
    length[:] = ln


def verify_bitset(schedule: Schedule, *, _chunks: int | None = None) -> Verification:
    """Bitset verifier: exact for any schedule; chunks are processed in batches to bound memory."""
    n = schedule.nranks
    c = schedule.nchunks if _chunks is None else _chunks
    words = (n + 63) // 64
    batch = max(1, min(c, _BITSET_BUDGET // (n * words * 8)))
    pre, post = _conditions(schedule, _chunks)
    full = np.zeros(words, np.uint64)
    for w in range(n):
        full[w // 64] |= np.uint64(1) << np.uint64(w % 64)
    bit = np.uint64(1) << (np.arange(n) % 64).astype(np.uint64)
    word = np.arange(n) // 64
    faults = []
    for c0 in range(0, c, batch):
        try:
            _bitset_batch(schedule, c0, min(c, c0 + batch), n, c, words, pre, post, full, bit, word)
        except VerificationError as fault:  # keep looking: an earlier step may break in a later batch
            faults.append(fault)
    if faults:
        raise min(faults, key=lambda f: (f.step, f.rank, f.chunk))
    return _record(schedule, "bitset")


def _bitset_batch(schedule, c0, c1, n, c, words, pre, post, full, bit, word) -> None:
    """Run chunks ``c0 .. c1-1`` through the schedule on bitsets; raise at the first fault."""
    (pre_rank, pre_chunk, pre_who), (post_rank, post_chunk, post_want) = pre, post
    width = c1 - c0
    state = np.zeros((n * width, words), np.uint64)
    sel = (pre_chunk >= c0) & (pre_chunk < c1)
    state[pre_rank[sel] * width + pre_chunk[sel] - c0, word[pre_who[sel]]] |= bit[pre_who[sel]]
    for s in range(schedule.nsteps):
        src, dst, ch, combine = schedule.step(s)
        if width < c:
            keep = (ch >= c0) & (ch < c1)
            src, dst, ch, combine = src[keep], dst[keep], ch[keep], combine[keep]
        if not len(src):
            continue
        fsrc = src.astype(np.int64) * width + (ch - c0)
        fdst = dst.astype(np.int64) * width + (ch - c0)
        values = state[fsrc]  # start-of-step reads
        _first_empty_send(values.any(axis=1), src, ch, s)
        order, occurrence = _write_conflicts(dst.astype(np.int64) * c + ch, combine, s, c)
        for k in range(int(occurrence.max()) + 1 if len(occurrence) else 0):
            rows = order[occurrence == k]
            incoming = values[rows]
            slots = fdst[rows]
            red = combine[rows] == Combine.REDUCE
            if red.any():
                current = state[slots[red]]
                twice = (current & incoming[red]).any(axis=1)
                if twice.any():
                    j = int(np.flatnonzero(twice)[0])
                    r = int(rows[red][j])
                    both = _members(current[j] & incoming[red][j], n)
                    raise VerificationError(
                        f"rank {int(src[r])} adds chunk {int(ch[r])} into rank {int(dst[r])}, "
                        f"counting {_describe(both, n)} twice",
                        step=s, rank=int(dst[r]), chunk=int(ch[r]))
                incoming[red] |= current
            state[slots] = incoming
    sel = (post_chunk >= c0) & (post_chunk < c1)
    rank, chunk, want = post_rank[sel], post_chunk[sel], post_want[sel]
    got = state[rank * width + chunk - c0]
    need = np.zeros_like(got)
    is_full = want == FULL
    need[is_full] = full
    single = np.flatnonzero(~is_full)
    need[single, word[want[single]]] = bit[want[single]]
    bad = np.flatnonzero((got != need).any(axis=1))
    if len(bad):
        i = int(bad[0])
        what = "the reduction of all ranks" if want[i] == FULL else f"rank {int(want[i])}'s chunk"
        raise VerificationError(f"ends holding {_describe(_members(got[i], n), n)}, needs {what}",
                                step=schedule.nsteps, rank=int(rank[i]), chunk=int(chunk[i]))


def _members(row: np.ndarray, n: int) -> np.ndarray:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:n]
    return np.flatnonzero(bits)
