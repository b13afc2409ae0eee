"""PipSwitch: all-to-all connectivity among n ports as rounds of matchings on a mesh of 2x2 unit cells.

A switch built from programmable unit cells (tunable couplers, each in *bar* or *cross* state) connects
its n ports through a sequence of rounds; each round is a matching (a set of duplex circuits a<->b),
and over all rounds every pair of ports must meet (PipSwitch, arXiv 2501.18136).

The rounds
    The circle (round-robin) method gives a 1-factorization of the complete graph K_n for even n
    (n-1 perfect matchings, every pair exactly once); for odd n it runs on n+1 vertices and drops
    the dummy, giving a near-1-factorization (n rounds, each leaving one port idle).

Why that many rounds is the fewest (``lower_bound_rounds``)
    A round is a matching, so it joins at most floor(n/2) of the n(n-1)/2 pairs. Hence
    rounds >= n(n-1)/2 / floor(n/2), which is n-1 for even n and n for odd n; the circle method
    meets it, so it is optimal. (The tests also check by brute force, for small n, that no set of
    fewer matchings covers every pair.)

The mesh: a crossbar of n x n cells (``mesh="crossbar"``), and why every round is realizable
    Input (TX) i enters row i from the west, output (RX) j leaves column j at the south. A cell in
    bar state passes west->east and north->south; in cross state west->south and north->east.
    Round with duplex permutation pi (pi(a)=b, pi(b)=a; idle ports carry nothing) sets cell
    (i, pi(i)) to cross for every active i. Then circuit i runs east along row i to column pi(i),
    turns south and runs down column pi(i) to the edge: the cells west of the turn are bar (row i
    has one cross cell), the cells below it are bar on their north input (column pi(i) has one
    cross cell, at row i), and the north input of the turning cell is dark (no other circuit enters
    column pi(i)). Every cell channel (a cell's west or north input) carries at most one circuit
    because pi is a permutation. So every matching is realizable, for any n -- which is why we chose
    the crossbar over a Benes network (n a power of two, looping algorithm) or the hexagonal 9x9
    prototype (no simple realizability proof): a simple, provable realisation. ``trace`` follows
    the light cell by cell and is how ``plan_pipswitch`` checks it.

Fewest cell changes
    A cell that no circuit crosses in a round (dark) may stay in whatever state it had, so the
    setting of a round is not unique. For a fixed order of rounds each cell independently needs
    one change per alternation of its *required* states (bar/cross on lit rounds, ignoring dark
    ones); holding the last state through dark rounds reaches exactly that, so it is the optimal
    setting for that order (``order_changes``). The order is then chosen: every order when there
    are at most ``EXHAUSTIVE_ROUNDS`` rounds; otherwise greedily (the next round is the one with
    the fewest changes from the current cell states, all candidates scored in one vector op), from
    several starting rounds, and each candidate order (the naive one among them, so the result is
    never worse than it) is then started at its best rotation (``rotation_changes`` scores all
    rotations exactly in one O(rounds x cells) pass). All this runs over several port relabellings
    of the circle method (different 1-factorizations), keeping the best. On the crossbar every
    off-diagonal cell turns exactly one circuit over all rounds, so about 2 changes per cell are
    unavoidable whatever the order; the order only decides which cells are spared (dark cells that
    hold their state), and the gain over the naive order is small (a fraction of a percent at 128
    ports; up to ~15% at n <= 10).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from lightrail.defaults import MAX_PORTS, MESHES
from lightrail.errors import ScenarioError

__all__ = ["MESHES", "MAX_PORTS", "EXHAUSTIVE_ROUNDS", "PipSwitchResult", "lower_bound_rounds", "round_robin",
           "is_one_factorization", "crossbar_requirements", "trace", "order_changes", "rotation_changes",
           "plan_pipswitch"]

EXHAUSTIVE_ROUNDS = 7
"""Up to this many rounds every order is tried (7! = 5040); above it, greedy orders at their best rotation."""

# MESHES and MAX_PORTS live in lightrail.defaults (the CLI's help shows them without numpy); re-exported here.

BAR, CROSS, FREE = 0, 1, -1
"""Required cell states; FREE: no circuit crosses the cell, any state will do."""


def _check_ports(n: int, *, limit: bool = False) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ScenarioError(f"{n!r} ports is too few", field="ports", fix="use 2 or more ports")
    if limit and n > MAX_PORTS:
        raise ScenarioError(f"{n} ports is too many for a plan of every round's cells", field="ports",
                            fix=f"use at most {MAX_PORTS} ports")
    return int(n)


def lower_bound_rounds(n: int) -> int:
    """Fewest matchings that cover every pair of n ports: n-1 for even n, n for odd n.

    >>> lower_bound_rounds(32), lower_bound_rounds(9)
    (31, 9)
    """
    n = _check_ports(n)
    return n - 1 if n % 2 == 0 else n


def round_robin(n: int) -> np.ndarray:
    """The circle-method rounds as a partner array ``(rounds, n)``: ``p[k, i]`` is i's partner, -1 if idle.

    >>> round_robin(4).tolist()
    [[3, 2, 1, 0], [2, 3, 0, 1], [1, 0, 3, 2]]
    """
    n = _check_ports(n)
    m = n + (n % 2)  # a dummy vertex for odd n
    rounds = m - 1
    k = np.arange(rounds)[:, None]
    i = np.arange(1, m // 2)[None, :]
    a, b = (k + i) % rounds, (k - i) % rounds
    partner = np.empty((rounds, m), dtype=np.int64)
    rows = np.broadcast_to(k, a.shape)
    partner[rows, a] = b
    partner[rows, b] = a
    partner[np.arange(rounds), np.arange(rounds)] = m - 1
    partner[:, m - 1] = np.arange(rounds)
    partner = partner[:, :n]
    partner[partner == n] = -1
    return partner


def _as_partners(rounds, n: int) -> np.ndarray:
    """Partner array from either a partner array or a list of rounds of pairs."""
    if isinstance(rounds, np.ndarray) and rounds.ndim == 2 and rounds.shape[1] == n:
        return rounds.astype(np.int64)
    partner = np.full((len(rounds), n), -1, dtype=np.int64)
    for k, pairs in enumerate(rounds):
        for a, b in pairs:
            if not (0 <= a < n and 0 <= b < n):
                raise ValueError(f"round {k} names a port outside 0..{n - 1}")
            if partner[k, a] != -1 or partner[k, b] != -1 or a == b:
                raise ValueError(f"round {k} is not a matching")
            partner[k, a], partner[k, b] = b, a
    return partner


def is_one_factorization(rounds, n: int) -> bool:
    """Whether ``rounds`` (lists of pairs, or a partner array) meet every pair of n ports exactly once,
    in the fewest rounds: perfect matchings for even n (a 1-factorization of K_n), matchings leaving
    exactly one port idle for odd n (a near-1-factorization).

    >>> is_one_factorization([[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]], 4)
    True
    >>> is_one_factorization([[(0, 1), (2, 3)], [(0, 2), (1, 3)]], 4)
    False
    """
    try:
        p = _as_partners(rounds, n)
    except (ValueError, IndexError, TypeError):
        return False
    if p.shape != (lower_bound_rounds(n), n):
        return False
    idx = np.arange(n)
    active = p >= 0
    if np.any(p >= n) or np.any(p == idx[None, :]):
        return False
    rows = np.broadcast_to(np.arange(p.shape[0])[:, None], p.shape)
    if not np.all(p[rows[active], p[active]] == idx[None, :].repeat(p.shape[0], 0)[active]):
        return False  # not an involution: not a set of duplex pairs
    if not np.all(active.sum(1) == n - (n % 2)):
        return False
    met = np.zeros((n, n), dtype=np.int64)
    np.add.at(met, (np.broadcast_to(idx, p.shape)[active], p[active]), 1)
    return bool(np.all(met[~np.eye(n, dtype=bool)] == 1))


def crossbar_requirements(partner: np.ndarray) -> np.ndarray:
    """Required cell states ``(rounds, n, n)`` on an n x n crossbar: CROSS (1) at (i, pi(i)), BAR (0) on
    the other cells a circuit crosses, FREE (-1) on dark cells (any state realises the round)."""
    p = np.asarray(partner)
    rounds, n = p.shape
    inv = np.full_like(p, n)  # pi^-1(c), n when column c carries nothing
    act = p >= 0
    rows = np.broadcast_to(np.arange(rounds)[:, None], p.shape)
    inv[rows[act], p[act]] = np.broadcast_to(np.arange(n), p.shape)[act]
    col = np.arange(n)
    lit = (col[None, None, :] <= p[:, :, None]) | (col[None, :, None] >= inv[:, None, :])
    req = np.where(lit, BAR, FREE).astype(np.int8)
    req[rows[act], np.broadcast_to(col, p.shape)[act], p[act]] = CROSS
    return req


def trace(states: np.ndarray, partner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Follow every circuit's light through the crossbar, cell by cell, for all rounds at once.

    ``states`` is ``(rounds, n, n)`` bool (True = cross). Circuit i enters row i from the west.
    Returns ``(exit_column, uses)``: the column whose south edge each circuit leaves by (-1: it left
    by the east edge, or is idle), and per round and cell the number of circuits on each of its two
    input channels, ``(rounds, n, n, 2)`` (channel 0: west, 1: north)."""
    s = np.asarray(states, dtype=bool)
    rounds, n, _ = s.shape
    kk, ii = np.nonzero(np.asarray(partner) >= 0)
    r, c = ii.copy(), np.zeros_like(ii)
    d = np.zeros_like(ii)  # 0: moving east (entered by the west input), 1: moving south (north input)
    alive = np.ones(ii.shape, dtype=bool)
    exit_col = np.full(np.asarray(partner).shape, -1, dtype=np.int64)
    uses = np.zeros((rounds, n, n, 2), dtype=np.int64)
    for _ in range(2 * n):
        if not alive.any():
            break
        k, rr, cc, dd = kk[alive], r[alive], c[alive], d[alive]
        np.add.at(uses, (k, rr, cc, dd), 1)
        cross = s[k, rr, cc]
        east = (dd == 0) != cross  # bar keeps the direction, cross swaps it
        rr2, cc2 = np.where(east, rr, rr + 1), np.where(east, cc + 1, cc)
        d[alive] = np.where(east, 0, 1)
        out_south, out_east = rr2 >= n, cc2 >= n
        idx = np.flatnonzero(alive)
        exit_col[kk[idx[out_south]], ii[idx[out_south]]] = cc2[out_south]
        r[alive], c[alive] = rr2, cc2
        alive[idx[out_south | out_east]] = False
    return exit_col, uses


def _fill(req: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hold-last-state settings for rounds in this order: ``(states, changes_per_transition)``.

    ``req`` is ``(rounds, cells)`` (or ``(batch, rounds, cells)``) of BAR/CROSS/FREE."""
    rounds = req.shape[-2]
    given = req >= 0
    shape = (1,) * (req.ndim - 2) + (rounds, 1)
    idx = np.where(given, np.arange(rounds).reshape(shape), -1)
    idx = np.maximum.accumulate(idx, axis=-2)
    held = np.take_along_axis(req, np.maximum(idx, 0), axis=-2)
    held = np.where(idx >= 0, held, FREE)
    changes = ((held[..., 1:, :] != held[..., :-1, :]) & (held[..., :-1, :] >= 0)).sum(-1)
    first = np.take_along_axis(req, given.argmax(axis=-2)[..., None, :], axis=-2)
    first = np.where(first >= 0, first, BAR)
    return np.where(held >= 0, held, first), changes


def order_changes(req: np.ndarray, order) -> int:
    """Fewest cell changes between consecutive rounds when the rounds run in ``order``."""
    flat = req.reshape(req.shape[0], -1)
    return int(_fill(flat[np.asarray(order)])[1].sum())


def _greedy(lit: np.ndarray, cross: np.ndarray, start: int) -> tuple[list[int], int]:
    """Greedy order from ``start``: next is the round with the fewest changes from the held states."""
    rounds = lit.shape[0]
    state = np.full(lit.shape[1], FREE, dtype=np.int8)
    order, total = [start], 0
    left = np.ones(rounds, dtype=bool)
    left[start] = False
    state[lit[start]] = BAR
    state[cross[start]] = CROSS
    for _ in range(rounds - 1):
        on = np.flatnonzero(state == CROSS)
        at = state[cross]  # (rounds, circuits)
        cost = lit[:, on].sum(1) - (at == CROSS).sum(1) + (at == BAR).sum(1)
        cost[~left] = np.iinfo(cost.dtype).max
        nxt = int(np.argmin(cost))
        total += int(cost[nxt])
        order.append(nxt)
        left[nxt] = False
        state[lit[nxt]] = BAR
        state[cross[nxt]] = CROSS
    return order, total


def rotation_changes(req: np.ndarray) -> np.ndarray:
    """Fewest cell changes of every rotation of the round order: entry s is for rounds s, s+1, ..., s-1.

    Needs every cell to be CROSS in at most one round (true of any 1-factorization on the crossbar: cell
    (i, j) turns i's circuit towards j, and i meets j once). Such a cell then changes once if a BAR round
    comes before its cross round and once if one comes after; so it saves a change for every start s
    that puts its cross round before (after) all its BAR rounds, a cyclic range of starts that difference
    arrays add up for all cells at once: O(rounds x cells) for all rotations together."""
    rounds = req.shape[0]
    flat = req.reshape(rounds, -1)
    cross = flat == CROSS
    if np.any(cross.sum(0) > 1):
        raise ValueError("a cell is cross in two rounds")
    bar = flat == BAR
    cells = np.flatnonzero(cross.any(0) & bar.any(0))
    t = cross[:, cells].argmax(0)
    bar = bar[:, cells]
    k = np.arange(rounds)[:, None]
    last = np.maximum.accumulate(np.where(bar, k, -1), axis=0)  # last BAR round <= k
    nxt = np.minimum.accumulate(np.where(bar, k, rounds)[::-1], axis=0)[::-1]  # first BAR round >= k
    col = np.arange(cells.size)
    before = np.where(t > 0, last[np.maximum(t - 1, 0), col], -1)
    g1 = np.where(before >= 0, t - before, t + rounds - last[-1])
    after = np.where(t < rounds - 1, nxt[np.minimum(t + 1, rounds - 1), col], rounds)
    g2 = np.where(after < rounds, after - t, after - t + nxt[0])  # nxt[0]: the first BAR round overall
    diff = np.zeros(3 * rounds + 1, dtype=np.int64)
    # first-saving for starts t-g1+1 .. t, last-saving for starts t+1 .. t+g2 (shifted by rounds, cyclic)
    np.add.at(diff, t - g1 + 1 + rounds, 1)
    np.add.at(diff, t + 1 + rounds, -1)
    np.add.at(diff, t + 1 + rounds, 1)
    np.add.at(diff, t + g2 + 1 + rounds, -1)
    ext = np.cumsum(diff)[:3 * rounds]
    saved = ext[:rounds] + ext[rounds:2 * rounds] + ext[2 * rounds:]
    return 2 * cells.size - saved


def _best_order(req: np.ndarray, starts: int) -> tuple[list[int], int]:
    rounds = req.shape[0]
    flat = req.reshape(rounds, -1)
    if rounds <= EXHAUSTIVE_ROUNDS:
        perms = np.array(list(itertools.permutations(range(rounds))), dtype=np.int64)
        costs = _fill(flat[perms])[1].sum(-1)
        i = int(np.argmin(costs))
        return perms[i].tolist(), int(costs[i])
    lit = flat >= 0
    cross = np.stack([np.flatnonzero(row == CROSS) for row in flat])
    step = max(1, rounds // max(1, starts))
    candidates = [list(range(rounds))]  # the naive order is always a candidate
    candidates += [_greedy(lit, cross, s)[0] for s in range(0, rounds, step)[:starts]]
    best = None
    for order in candidates:  # each with its best rotation
        totals = rotation_changes(req[order])
        s = int(np.argmin(totals))
        if best is None or totals[s] < best[1]:
            best = (order[s:] + order[:s], int(totals[s]))
    return best


@dataclass(frozen=True)
class PipSwitchResult:
    """Rounds of duplex circuits on an n-port switch mesh, in the order they run, and their cell states.

    ``partners[k, i]`` is port i's partner in round k (-1: idle); ``states[k]`` is the ``(n, n)`` mesh of
    cells in round k (True: cross, False: bar); ``changes_per_round[k]`` counts the cells that change
    going into round k (0 for the first round)."""

    ports: int
    mesh: str
    partners: np.ndarray = field(repr=False)
    states: np.ndarray = field(repr=False)
    cell_changes: int
    changes_per_round: tuple[int, ...]
    naive_cell_changes: int
    lower_bound_rounds: int
    realizable: bool
    relabelling: str

    @property
    def cells(self) -> int:
        return int(self.states.shape[1] * self.states.shape[2])

    @property
    def rounds(self) -> list[list[tuple[int, int]]]:
        """Each round's matching as sorted pairs (a, b), a < b."""
        out = []
        for p in self.partners:
            a = np.flatnonzero(p > np.arange(self.ports))
            out.append([(int(x), int(p[x])) for x in a])
        return out

    def idle_ports(self) -> list[int | None]:
        return [int(np.flatnonzero(p < 0)[0]) if (p < 0).any() else None for p in self.partners]

    def to_dict(self) -> dict:
        return {
            "ports": self.ports, "mesh": self.mesh, "cells": self.cells,
            "rounds": [[list(pair) for pair in r] for r in self.rounds],
            "idle_ports": self.idle_ports() if self.ports % 2 else None,
            "lower_bound_rounds": self.lower_bound_rounds,
            "realizable": self.realizable,
            "cell_changes": self.cell_changes,
            "naive_cell_changes": self.naive_cell_changes,
            "changes_per_round": list(self.changes_per_round),
            "relabelling": self.relabelling,
            "cross_cells": [np.argwhere(s).tolist() for s in self.states],
        }


def _relabellings(n: int, count: int, seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    idx = np.arange(n)
    out = [("identity", idx), ("reversed", idx[::-1].copy()),
           ("interleaved", np.concatenate([idx[::2], idx[1::2]]))]
    while len(out) < count:
        out.append((f"random(seed={seed},{len(out) - 3})", rng.permutation(n)))
    return out[:max(1, count)]


def plan_pipswitch(ports: int, *, mesh: str = "crossbar", relabellings: int = 4, starts: int = 4,
                   seed: int = 0) -> PipSwitchResult:
    """All-to-all rounds for ``ports`` ports on a ``mesh`` of 2x2 cells, ordered for the fewest cell changes.

    Parameters
    ----------
    ports : number of switch ports, 2 or more.
    mesh : one of :data:`MESHES`.
    relabellings : how many port relabellings of the circle method to try (identity first).
    starts : starting rounds of the greedy order (when there are more than ``EXHAUSTIVE_ROUNDS``).
    seed : for the random relabellings.

    Raises
    ------
    ScenarioError : ports < 2 or > ``MAX_PORTS`` (field ``ports``), an unknown mesh (field ``mesh``).

    Examples
    --------
    >>> r = plan_pipswitch(6)
    >>> len(r.rounds), r.lower_bound_rounds, r.realizable, r.cell_changes <= r.naive_cell_changes
    (5, 5, True, True)
    """
    n = _check_ports(ports, limit=True)
    if mesh not in MESHES:
        raise ScenarioError(f"unknown mesh {mesh!r}", field="mesh", fix="use one of: " + ", ".join(MESHES))
    base = round_robin(n)
    naive_req = crossbar_requirements(base)
    naive = order_changes(naive_req, range(base.shape[0]))
    best = None
    for name, sigma in _relabellings(n, relabellings, seed):
        partner = np.full_like(base, -1)
        act = base >= 0
        partner[:, sigma] = np.where(act, sigma[np.maximum(base, 0)], -1)
        req = crossbar_requirements(partner)
        order, total = _best_order(req, starts)
        if best is None or total < best[0]:
            best = (total, name, partner[order], req[order])
    total, name, partner, req = best
    flat = req.reshape(req.shape[0], -1)
    states, changes = _fill(flat)
    states = states.reshape(req.shape).astype(bool)
    exit_col, uses = trace(states, partner)
    realizable = bool(np.array_equal(exit_col, partner) and uses.max(initial=0) <= 1)
    return PipSwitchResult(ports=n, mesh=mesh, partners=partner, states=states, cell_changes=int(changes.sum()),
                           changes_per_round=(0, *map(int, changes)), naive_cell_changes=naive,
                           lower_bound_rounds=lower_bound_rounds(n), realizable=realizable, relabelling=name)
