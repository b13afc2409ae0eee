"""StragglAR: AllReduce that hides a persistent straggler's delay (arXiv 2505.23523), for every n >= 2.

Rank n-1 is the straggler. Phase 1, while it is late: the n-1 early ranks reduce-scatter the buffer
cut into n-1 chunks (ring), so early rank c holds chunk c summed over the early ranks. Phase 2, once
it arrives: rounds in which every rank sends at most one chunk and receives at most one. In round
c < n-1 the straggler and rank c swap chunk c (both reduce, so both then hold the final chunk c);
meanwhile every rank holding a final chunk forwards one to a rank that lacks it, so a chunk's holders
can double each round. Forwarding is scheduled round by round as a maximum matching between free
holders and free ranks missing a chunk, each pair moving its rarest chunk.

Status: the schedule is correct (verified) for every n; its round count meets the lower bound for
n <= 5 and stays within ~20% of it up to n = 128, but synthesis costs an n x n x n product per round,
so it is not registered as an algorithm yet (n = 1,024 must synthesise in seconds).

Lower bound on phase-2 rounds (``lower_bound``): the straggler receives one chunk per round and needs
all n-1, so the last chunk becomes final no earlier than round n-2, at two ranks; reaching all n ranks
from two takes ceil(log2 n) - 1 more doubling rounds: n + ceil(log2 n) - 2 (n >= 2). And each early
rank other than rank 0 must receive n-1 chunks in rounds 1.. (nothing is final before round 0 ends):
at least n rounds.
"""

from __future__ import annotations

from math import ceil, log2

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from lightrail.collectives.collective import Kind
from lightrail.collectives.ring import ring_reduce_scatter_into
from lightrail.collectives.schedule import Op, Schedule, ScheduleBuilder
from lightrail.errors import UnsupportedError

__all__ = ["stragglar_allreduce", "phase2_rounds", "lower_bound"]


def lower_bound(n: int) -> int:
    """Fewest phase-2 rounds any schedule of this shape can take (see the module docstring)."""
    if n == 2:
        return 1
    return max(n + ceil(log2(n)) - 2, n)


def phase2_rounds(n: int) -> list[list[tuple[int, int, int, Op]]]:
    """Phase-2 rounds as lists of (src, dst, chunk, op); ranks 0..n-2 early, n-1 the straggler."""
    s = n - 1
    chunks = n - 1
    final = np.zeros((n, chunks), bool)  # final[r, c]: rank r holds the fully reduced chunk c
    rounds = []
    t = 0
    while not final.all():
        moves = []
        busy_send = np.zeros(n, bool)
        busy_recv = np.zeros(n, bool)
        if t < chunks:  # the straggler's swap of chunk t with rank t
            moves += [(s, t, t, Op.REDUCE), (t, s, t, Op.REDUCE)]
            busy_send[[s, t]] = busy_recv[[s, t]] = True
        holders = final.sum(axis=0)
        # Most forwards this round: a maximum matching between free holders and free ranks that lack a
        # chunk some free holder has; each matched pair then moves the rarest such chunk.
        # First reach ranks that hold no final chunk yet (they become forwarders next round), then
        # anyone else; each stage is a maximum matching, each pair moves its rarest chunk.
        empty = ~final.any(axis=1)
        for stage in (empty, ~empty):
            can_send = ~busy_send & final.any(axis=1)
            can_recv = ~busy_recv & ~final.all(axis=1) & stage
            lacks = (final.astype(np.float32) @ (~final).T.astype(np.float32)) > 0  # u holds a chunk v lacks
            useful = lacks & can_send[:, None] & can_recv[None, :]
            np.fill_diagonal(useful, False)
            match = maximum_bipartite_matching(csr_matrix(useful.astype(np.int8)), perm_type="column")
            for u in range(n):
                v = match[u]
                if v < 0:
                    continue
                options = np.flatnonzero(final[u] & ~final[v])
                c = int(options[np.lexsort((-options, holders[options]))[0]])
                moves.append((int(u), int(v), c, Op.COPY))
                busy_send[u] = busy_recv[v] = True
        for _, v, c, op in moves:
            if op is Op.COPY:
                final[v, c] = True
        if t < chunks:
            final[[s, t], t] = True
        rounds.append(moves)
        t += 1
    return rounds


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
    for moves in phase2_rounds(n):
        for op in (Op.REDUCE, Op.COPY):
            chosen = [(u, v, c) for u, v, c, o in moves if o is op]
            if chosen:
                src, dst, ch = (np.array(x) for x in zip(*chosen, strict=True))
                b.add(step, rank[src], rank[dst], ch, op)
        step += 1
    return b.build(f"stragglar_allreduce(n={n})", phase1_steps=phase1, straggler=straggler)
