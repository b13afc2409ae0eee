"""StragglAR: AllReduce that hides a persistent straggler's delay (arXiv 2505.23523), for every n >= 2.

Rank n-1 is the straggler (``straggler=`` relabels). Phase 1, while it is late: the n-1 early ranks
reduce-scatter the buffer cut into n-1 chunks (ring), so early rank c holds chunk c summed over the
early ranks. Phase 2, once it arrives: rounds in which every rank sends at most one chunk and
receives at most one. In round c < n-1 the straggler and rank c swap chunk c (both reduce, so both
then hold the final chunk c); meanwhile ranks holding final chunks forward them to ranks that lack
them, so a chunk's holders can double each round.

Forwarding is a greedy, round by round, newest chunk first (the youngest chunks have the most
doubling left to do). A chunk's free holders send to free ranks lacking it, preferring receivers
that hold the fewest other chunks still spreading (a rank holding two spreading chunks can forward
only one of them, which breaks the doubling) and, among those, the ones with the oldest newest chunk
and the highest rank (it swaps with the straggler last, so it stays free longest); senders with the
fewest other chunks to spread go first. Each chunk is a few numpy operations over the ranks, so
n = 1,024 synthesises in about a second. Rounds against the bound: equal for 100 of n = 2..256 and
never more than 3 above it up to n = 1,024 (``lightrail stragglar rounds --ranks 2..256``).

Lower bound on phase-2 rounds (``lower_bound``): the straggler receives one chunk per round and needs
all n-1, so the last chunk becomes final no earlier than round n-2, at two ranks; reaching all n ranks
from two takes ceil(log2 n) - 1 more doubling rounds: n + ceil(log2 n) - 2 (n >= 3). And each early
rank other than rank 0 must receive n-1 chunks in rounds 1.. (nothing is final before round 0 ends):
at least n rounds. (Counting the early ranks' receive slots after the straggler frees up, against
the copies each late chunk still needs, gives the same bound for every n up to 1,024 we checked.)
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, log2
from typing import NamedTuple

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.ring import ring_reduce_scatter_into
from lightrail.collectives.schedule import Op, Schedule, ScheduleBuilder
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
    op: np.ndarray  # Op.REDUCE for the straggler swaps, Op.COPY for forwarding

    @property
    def rounds(self) -> int:
        return int(self.round.max()) + 1 if len(self.round) else 0


@lru_cache(maxsize=512)
def phase2(n: int) -> Phase2:
    """Synthesise phase 2 for n ranks (greedy described in the module docstring); arrays are read-only."""
    s, m = n - 1, n - 1
    final = np.zeros((n, m), bool)  # final[r, c]: rank r holds the fully reduced chunk c
    holders = np.zeros(m, np.int64)
    newest = np.full(n, -1)  # newest final chunk each rank holds
    ranks = np.arange(n)
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, Op]] = []
    t = 0
    while t < m or (holders < n).any():
        busy_send = np.zeros(n, bool)
        busy_recv = np.zeros(n, bool)
        if t < m:  # the straggler swaps chunk t with rank t
            parts.append((t, np.array([s, t]), np.array([t, s]), np.array([t, t]), Op.REDUCE))
            busy_send[[s, t]] = busy_recv[[s, t]] = True
        spreading = np.flatnonzero(holders[:min(t, m)] < n)
        burden = final[:, spreading].sum(axis=1)  # chunks each rank holds that are still spreading
        moved = []
        for c in spreading[::-1]:
            send = np.flatnonzero(final[:, c] & ~busy_send)
            recv = np.flatnonzero(~final[:, c] & ~busy_recv)
            k = min(len(send), len(recv))
            if k:
                recv = recv[np.lexsort((-ranks[recv], newest[recv], burden[recv]))[:k]]
                send = send[np.lexsort((-newest[send], burden[send]))[:k]]
                busy_send[send] = busy_recv[recv] = True
                holders[c] += k
                moved.append((send, recv, c))
            if holders[c] >= n:  # completes this round: no longer a burden for older chunks' receivers
                burden -= final[:, c]
        for send, recv, c in moved:
            final[recv, c] = True
            newest[recv] = np.maximum(newest[recv], c)
            parts.append((t, send, recv, np.full(len(send), c), Op.COPY))
        if t < m:
            final[[s, t], t] = True
            holders[t] += 2
            newest[[s, t]] = np.maximum(newest[[s, t]], t)
        t += 1
    out = Phase2(*(np.concatenate([np.broadcast_to(np.asarray(p[i]), p[1].shape) for p in parts])
                   for i in range(4)),
                 np.concatenate([np.full(len(p[1]), p[4], np.int8) for p in parts]))
    for a in out:
        a.flags.writeable = False
    return out


@register(Kind.ALLREDUCE, "stragglar", steps="n-2 + ~n+log2(n)-2",
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
    for op in (Op.REDUCE, Op.COPY):
        mine = p2.op == op
        b.add(step + p2.round[mine], rank[p2.src[mine]], rank[p2.dst[mine]], p2.chunk[mine], op)
    return b.build(f"stragglar_allreduce(n={n})", phase1_steps=phase1, straggler=straggler)
