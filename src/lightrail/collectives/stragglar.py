"""StragglAR: AllReduce that hides a persistent straggler's delay (arXiv 2505.23523), for every n >= 2.

Rank n-1 is the straggler (``straggler=`` relabels). Phase 1, while it is late: the n-1 early ranks
reduce-scatter the buffer cut into n-1 chunks (ring), so early rank c holds chunk c summed over the
early ranks. Phase 2, once it arrives: rounds in which every rank sends at most one chunk and
receives at most one. In round c < n-1 the straggler and rank c swap chunk c (both reduce, so both
then hold the final chunk c); meanwhile ranks holding final chunks forward them to ranks that lack
them, so a chunk's holders can double each round.

Lower bound on phase-2 rounds (``lower_bound``): the straggler receives one chunk per round and needs
all n-1, so the last chunk becomes final no earlier than round n-2, at two ranks; reaching all n ranks
from two takes ceil(log2 n) - 1 more doubling rounds: n + ceil(log2 n) - 2 (n >= 3). And each early
rank other than rank 0 must receive n-1 chunks in rounds 1.. (nothing is final before round 0 ends):
at least n rounds. (Counting the early ranks' receive slots after the straggler frees up, against
the copies each late chunk still needs, gives the same bound for every n up to 1,024 we checked.)

**n = 2^k: a cyclic exchange that meets the bound**, n + k - 2 rounds, and moves each chunk to each
rank exactly once ((n-1)(n-2) copies besides the 2(n-1) swap halves). Rank x sits at *offset*
(x - r) mod (n-1) in round r, so the rank swapping with the straggler (rank r) is at offset 0 and
every early rank moves down one offset per round. A fixed *age* g(d) in 1..k per offset names the one
chunk still spreading that the rank at offset d holds when round r starts: chunk r - g(d) (nothing
if negative). Read from offset n-2 down to 0, g is the run 1, 2, ..., k followed, for a = 2..k, by
2^(a-2) runs a, a+1, ..., k (n = 8, offsets 6..0: 1 2 3 | 2 3 | 3 | 3). Hence

- (i) 2^(j-1) offsets have age j (the first run and the 2^(j-1) - 1 runs starting at 2..j pass
  through j): a chunk of age j has 2^(j-1) early holders, the oldest (age k) n/2;
- (ii) g(d-1) = g(d) + 1 when g(d) < k: a rank keeps its chunk and it ages by one;
- (iii) g(0) = k, g(n-2) = 1: the swapping rank holds the oldest chunk, and next round the chunk it
  has just finalised; and an age-k offset d > 0 is followed by a run starting at g(d-1) = j+1 for
  exactly 2^(j-1) of them, one per offset of age j, j < k.

Round r pairs each age-k offset d > 0 with an offset of age j = g(d-1) - 1 (the counts of (iii) and
(i) agree) and the two swap: the young rank sends its chunk r - j, the old one the oldest, r - k.
Proof, by induction on the invariant "when round r starts, every early rank holds exactly one chunk
still spreading, r - g(d), and all older chunks are complete" (true at r = 0, where no chunk exists
and nothing but the straggler swap happens). One send and one receive per rank: offset 0 goes with
the straggler and the pairs cover every other offset once. Every chunk arrives where it is missing:
the young rank's only spreading chunk is r - j, not r - k, and the reverse. The invariant holds at
r + 1: young ranks keep r - j (ii); old ranks now hold r - j, of age j + 1 = g(d-1) at their new
offset d - 1; rank r holds chunk r, age 1 at offset n-2 (iii); and chunk r - k is complete, since
its n/2 - 1 holders other than rank r sent it to the n/2 - 1 early ranks of age < k (the straggler
has had it since round r - k). Chunks of negative index are nothing: their sends are left out.
Tail, rounds n-1..n+k-3: no chunk r >= n-1 exists; read any chunk >= n-1 as the last one, n-2, and
let the straggler (holding every chunk since round n-2) send chunk n-2 to the offset-0 rank in place
of the swap. Ranks "holding" a chunk >= n-2 then hold chunk n-2 and send it only to age-k ranks,
which hold chunk r - k <= n-3 and lack it, so the argument stands; chunk c <= n-3 is complete after
round c + k <= n+k-3, and in round n+k-3 every age-k rank receives chunk n-2 (from its partner or,
at offset 0, from the straggler) while every other rank holds it: all complete after n + k - 2 rounds.
It is a few numpy operations over (round, pair); n = 1,024 takes about 0.05 s.

**Other n: a greedy**, round by round, newest chunk first (the youngest chunks have the most doubling
left to do). A chunk's free holders send to free ranks lacking it, preferring receivers that hold the
fewest other chunks still spreading (a rank holding two spreading chunks can forward only one of
them, which breaks the doubling) and, among those, the ones with the oldest newest chunk and the
highest rank (it swaps with the straggler last, so it stays free longest); senders with the fewest
other chunks to spread go first. Each chunk is a few numpy operations over the ranks (n = 1,000 in
about a second). Rounds against the bound (``lightrail stragglar rounds --ranks 2..1024``): equal at
every power of two, at 98 of the other n = 2..256 (106 in all) and 406 of the 1,013 other n up to
1,024; never more than 3 above it up to n = 256, but 4 to 10 above it at 58 n in 495..1,022 (10 at
n = 517, 8 at 516, 7 at 1,022), where the greedy's doubling breaks down.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, log2
from typing import NamedTuple

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.ring import ring_reduce_scatter_into
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder
from lightrail.errors import UnsupportedError

__all__ = ["stragglar_allreduce", "phase2", "Phase2", "lower_bound"]


def lower_bound(n: int) -> int:
    """Fewest phase-2 rounds any schedule of this shape can take (see the module docstring)."""
    if n == 2:
        return 1
    return max(n + ceil(log2(n)) - 2, n)


class Phase2(NamedTuple):
    """Phase-2 transfers as parallel arrays; ranks 0..n-2 are early, n-1 the straggler."""

    round: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    combine: np.ndarray  # Combine.REDUCE for the straggler swaps, Combine.COPY for forwarding

    @property
    def rounds(self) -> int:
        return int(self.round.max()) + 1 if len(self.round) else 0


@lru_cache(maxsize=512)
def phase2(n: int) -> Phase2:
    """Synthesise phase 2 for n ranks: the cyclic exchange at powers of two, else the greedy (both in
    the module docstring). Arrays are read-only."""
    if n < 2:
        raise UnsupportedError(f"StragglAR needs at least 2 ranks, got {n}", field="ranks", fix="use n >= 2")
    out = _cyclic_exchange(n) if n & (n - 1) == 0 else _greedy(n)
    for a in out:
        a.flags.writeable = False
    return out


def _ages(k: int) -> np.ndarray:
    """g(d), the age of the chunk the rank at offset d holds (module docstring), for n = 2^k."""
    runs = [np.arange(1, k + 1)] + [np.arange(a, k + 1) for a in range(2, k + 1) for _ in range(1 << (a - 2))]
    return np.concatenate(runs)[::-1]  # written from offset n-2 down to 0


def _cyclic_exchange(n: int) -> Phase2:
    """Phase 2 for n = 2^k in n + k - 2 rounds (module docstring)."""
    k, m, s = n.bit_length() - 1, n - 1, n - 1  # m early ranks and chunks; s the straggler
    g = _ages(k)
    d = np.arange(m)
    young = np.flatnonzero(g < k)
    old = np.flatnonzero((g == k) & (d > 0))
    young = young[np.argsort(g[young], kind="stable")]  # offsets by age j ...
    old = old[np.argsort(g[old - 1] - 1, kind="stable")]  # ... and the age-k offsets that join age j
    rounds = n + k - 2
    r = np.arange(rounds)[:, None]
    y_rank, o_rank = (r + young) % m, (r + old) % m
    y_chunk = np.minimum(r - g[young], n - 2)  # tail: any chunk >= n-1 reads as the last, n-2
    o_chunk = np.broadcast_to(r - k, o_rank.shape)
    r = np.broadcast_to(r, y_rank.shape)
    ys, os_ = y_chunk >= 0, o_chunk >= 0  # chunks of negative index do not exist yet
    t, tail = np.arange(m), np.arange(m, rounds)
    return Phase2(
        np.concatenate([t, t, tail, r[ys], r[os_]]),
        np.concatenate([np.full(m, s), t, np.full(len(tail), s), y_rank[ys], o_rank[os_]]),
        np.concatenate([t, np.full(m, s), tail % m, o_rank[ys], y_rank[os_]]),
        np.concatenate([t, t, np.full(len(tail), n - 2), y_chunk[ys], o_chunk[os_]]),
        np.concatenate([np.full(2 * m, Combine.REDUCE, np.int8),
                        np.full(len(tail) + ys.sum() + os_.sum(), Combine.COPY, np.int8)]))


def _greedy(n: int) -> Phase2:
    """Phase 2 for any n >= 2 by the greedy of the module docstring."""
    s, m = n - 1, n - 1
    hold = np.zeros((m, n), bool)  # hold[c, r]: rank r holds the fully reduced chunk c
    holders = np.zeros(m, np.int64)
    newest = np.full(n, -1)  # newest final chunk each rank holds
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    at: list[tuple[int, int]] = []  # (round, chunk) of each forwarding batch
    t = 0
    while t < m or (holders < n).any():
        busy_send = np.zeros(n, bool)
        if t < m:  # the straggler swaps chunk t with rank t
            busy_send[[s, t]] = True
        busy_recv = busy_send.copy()
        spreading = np.flatnonzero(holders[:min(t, m)] < n)
        burden = hold[spreading].sum(axis=0)  # chunks each rank holds that are still spreading
        moved = []
        for c in spreading[::-1]:
            send = np.flatnonzero(hold[c] & ~busy_send)
            recv = np.flatnonzero(~(hold[c] | busy_recv))
            k = min(len(send), len(recv))
            if k:
                recv = recv[np.lexsort((-recv, newest[recv], burden[recv]))[:k]]
                send = send[np.lexsort((-newest[send], burden[send]))[:k]]
                busy_send[send] = busy_recv[recv] = True
                holders[c] += k
                moved.append((send, recv, c))
            if holders[c] >= n:  # completes this round: no longer a burden for older chunks' receivers
                burden -= hold[c]
        for send, recv, c in moved:
            hold[c, recv] = True
            newest[recv] = np.maximum(newest[recv], c)
            src.append(send)
            dst.append(recv)
            at.append((t, c))
        if t < m:
            hold[t, [s, t]] = True
            holders[t] += 2
            newest[[s, t]] = np.maximum(newest[[s, t]], t)
        t += 1
    sizes = [len(x) for x in src]
    when, which = (np.repeat(np.array([a[i] for a in at], np.int64), sizes) for i in (0, 1))
    swaps = np.arange(m)
    return Phase2(np.concatenate([swaps, swaps, when]), np.concatenate([np.full(m, s), swaps, *src]),
                  np.concatenate([swaps, np.full(m, s), *dst]), np.concatenate([swaps, swaps, which]),
                  np.concatenate([np.full(2 * m, Combine.REDUCE, np.int8), np.full(len(when), Combine.COPY, np.int8)]))


@register(Kind.ALLREDUCE, "stragglar", steps="n-2 + n+log2(n)-2 (n=2^k; else a few more)",
          summary="StragglAR: reduce-scatter among early ranks while rank n-1 is late, then swaps + doubling")
def stragglar_allreduce(n: int, straggler: int | None = None) -> Schedule:
    """StragglAR AllReduce with ``straggler`` (default n-1) arriving late; ``params['phase1_steps']``
    marks the split between the early ranks' reduce-scatter and the rounds after it arrives."""
    straggler = n - 1 if straggler is None else int(straggler)
    if not 0 <= straggler < n:
        raise UnsupportedError(f"straggler {straggler} is not a rank of {n}", field="straggler",
                               fix=f"pick a rank in 0..{n - 1}")
    rank = np.array([r for r in range(n) if r != straggler] + [straggler])  # synthesis rank -> real rank
    b = ScheduleBuilder(Kind.ALLREDUCE, n, n - 1)
    early = rank[:-1]
    step = ring_reduce_scatter_into(b, 0, early[None, :], np.arange(n - 1).reshape(1, n - 1, 1))
    phase1 = step
    p2 = phase2(n)
    for combine in (Combine.REDUCE, Combine.COPY):
        mine = p2.combine == combine
        b.add(step + p2.round[mine], rank[p2.src[mine]], rank[p2.dst[mine]], p2.chunk[mine], combine)
    return b.build(f"stragglar_allreduce(n={n})", phase1_steps=phase1, straggler=straggler)
