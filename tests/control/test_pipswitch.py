"""PipSwitch: the rounds meet every pair in the fewest rounds, every round is realizable on the crossbar
(checked by an independent cell-by-cell trace), and the cell changes are recounted and compared with the
naive order and with brute force over orders."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightrail.control.pipswitch import (
    EXHAUSTIVE_ROUNDS,
    MAX_PORTS,
    crossbar_requirements,
    is_one_factorization,
    lower_bound_rounds,
    order_changes,
    plan_pipswitch,
    rotation_changes,
    round_robin,
)
from lightrail.errors import ScenarioError

SIZES = list(range(2, 21)) + [31, 32, 33]


# ---- independent helpers (plain Python, no library code) ---------------------------------------------------

def python_trace(states, partner):
    """Walk each circuit through the crossbar; returns {input: exit column} and the (row, col, channel) used."""
    n = len(partner)
    exits, used = {}, []
    for i in range(n):
        if partner[i] < 0:
            continue
        r, c, moving_east = i, 0, True
        while r < n and c < n:
            used.append((r, c, "west" if moving_east else "north"))
            if states[r][c]:  # cross swaps the direction
                moving_east = not moving_east
            if moving_east:
                c += 1
            else:
                r += 1
        exits[i] = c if r >= n else None  # None: left by the east edge
    return exits, used


def python_requirements(partner):
    """{(row, col): required state} for one round from the crossbar geometry: circuit i runs along row i
    to column pi(i), turns there (cross) and runs down column pi(i); other cells it crosses are bar."""
    n, req = len(partner), {}
    for i, j in enumerate(partner):
        if j < 0:
            continue
        for c in range(j):
            req[(i, c)] = False
        for r in range(i + 1, n):
            req[(r, j)] = False
    for i, j in enumerate(partner):
        if j >= 0:
            req[(i, j)] = True
    return req


def python_min_changes(rounds_req, n):
    """Fewest cell changes for rounds in the given order: per cell, alternations of its required states."""
    total = 0
    for cell in itertools.product(range(n), range(n)):
        seq = [req[cell] for req in rounds_req if cell in req]
        total += sum(a != b for a, b in itertools.pairwise(seq))
    return total


def python_recount(states):
    return sum(int(a != b) for prev, cur in itertools.pairwise(states) for ra, rb in zip(prev, cur, strict=True)
               for a, b in zip(ra, rb, strict=True))


def pairs_to_partner(pairs, n):
    p = [-1] * n
    for a, b in pairs:
        p[a], p[b] = b, a
    return p


# ---- the rounds --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
def test_circle_method_is_a_one_factorization(n):
    p = round_robin(n)
    assert p.shape == (lower_bound_rounds(n), n)
    assert is_one_factorization(p, n)
    met = {frozenset((a, int(b))) for row in p for a, b in enumerate(row) if b >= 0}
    assert len(met) == n * (n - 1) // 2
    idle = (p < 0).sum(1)
    assert np.all(idle == n % 2)  # perfect matchings for even n, one idle port per round for odd n


@pytest.mark.parametrize("n", SIZES)
def test_plan_rounds_meet_every_pair_in_the_lower_bound(n):
    r = plan_pipswitch(n)
    assert is_one_factorization(r.rounds, n)
    assert len(r.rounds) == r.lower_bound_rounds == (n - 1 if n % 2 == 0 else n)
    pairs = [frozenset(pair) for rnd in r.rounds for pair in rnd]
    assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
    for rnd in r.rounds:  # each round is a matching
        ports = [x for pair in rnd for x in pair]
        assert len(ports) == len(set(ports)) == n - n % 2


def test_checker_rejects_broken_factorizations():
    good = [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]
    assert is_one_factorization(good, 4)
    assert not is_one_factorization(good[:2], 4)  # a pair never meets
    assert not is_one_factorization([good[0], good[0], good[2]], 4)  # a pair meets twice
    assert not is_one_factorization([[(0, 1), (1, 2)], good[1], good[2]], 4)  # not a matching
    assert not is_one_factorization([[(0, 1)], good[1], good[2]], 4)  # not perfect
    assert not is_one_factorization([[(0, 1), (2, 4)], good[1], good[2]], 4)  # no port 4
    assert not is_one_factorization([[(0, 1), (-1, 2)], good[1], good[2]], 4)
    five = [[tuple(sorted((a, int(b)))) for a, b in enumerate(row) if a < b] for row in round_robin(5)]
    assert is_one_factorization(five, 5)
    assert not is_one_factorization(five[:-1] + [five[-1][:1]], 5)  # two idle ports in one round


def matchings_as_edge_masks(n):
    """Every maximal matching of K_n (as a bitmask over the edges); a cover by any matchings gives one by
    maximal ones, so these suffice for the brute force."""
    edges = list(itertools.combinations(range(n), 2))
    bit = {e: 1 << k for k, e in enumerate(edges)}
    masks = set()
    for size in range(1, n // 2 + 1):
        for chosen in itertools.combinations(edges, size):
            ports = [x for e in chosen for x in e]
            if len(set(ports)) == len(ports) and n - len(ports) < 2:
                masks.add(sum(bit[e] for e in chosen))
    return sorted(masks), (1 << len(edges)) - 1


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_brute_force_no_fewer_rounds_cover_every_pair(n):
    masks, everything = matchings_as_edge_masks(n)
    fewer = lower_bound_rounds(n) - 1
    assert all(union_of(combo) != everything for combo in itertools.combinations(masks, fewer))
    # and the lower bound itself is reached
    assert any(union_of(combo) == everything for combo in itertools.combinations(masks, fewer + 1))


def union_of(masks):
    out = 0
    for m in masks:
        out |= m
    return out


# ---- realizability -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", list(range(2, 17)) + [24, 25])
def test_every_round_is_realized_cell_by_cell(n):
    r = plan_pipswitch(n)
    assert r.realizable
    assert r.states.shape == (len(r.rounds), n, n)
    for k, pairs in enumerate(r.rounds):
        partner = pairs_to_partner(pairs, n)
        assert partner == r.partners[k].tolist()
        exits, used = python_trace(r.states[k].tolist(), partner)
        # each circuit enters at its input (row i, west) and leaves at its output (column pi(i), south)
        assert exits == {i: j for i, j in enumerate(partner) if j >= 0}
        # no cell channel carries two circuits
        assert len(used) == len(set(used))


def test_a_wrong_cell_state_is_caught():
    r = plan_pipswitch(6)
    states = r.states[0].tolist()
    i, j = r.rounds[0][0]
    states[i][j] = False  # the turning cell back to bar: circuit i runs on east
    exits, _ = python_trace(states, r.partners[0].tolist())
    assert exits[i] != j


# ---- cell changes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", list(range(2, 17)) + [24, 25])
def test_cell_changes_recounted(n):
    r = plan_pipswitch(n)
    states = r.states.tolist()
    assert python_recount(states) == r.cell_changes == sum(r.changes_per_round)
    assert r.changes_per_round[0] == 0
    # the states meet every round's requirements, and reach the fewest changes for this order
    reqs = [python_requirements(p) for p in r.partners.tolist()]
    for k, req in enumerate(reqs):
        assert all(states[k][a][b] == want for (a, b), want in req.items())
    assert r.cell_changes == python_min_changes(reqs, n)


@pytest.mark.parametrize("n", list(range(2, 21)) + [32])
def test_never_worse_than_the_naive_order(n):
    r = plan_pipswitch(n)
    naive = python_min_changes([python_requirements(p) for p in round_robin(n).tolist()], n)
    assert r.naive_cell_changes == naive
    assert r.cell_changes <= naive


def test_small_cases_improve_on_the_naive_order():
    assert any(plan_pipswitch(n).cell_changes < plan_pipswitch(n).naive_cell_changes for n in range(3, 11))


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_order_equals_brute_force_over_orders(n):
    r = plan_pipswitch(n)
    reqs = [python_requirements(p) for p in r.partners.tolist()]
    best = min(python_min_changes([reqs[k] for k in order], n) for order in itertools.permutations(range(len(reqs))))
    assert r.cell_changes == best


def test_vectorised_requirements_match_the_geometry():
    for n in (5, 8, 11):
        p = round_robin(n)
        req = crossbar_requirements(p)
        for k, row in enumerate(p.tolist()):
            want = python_requirements(row)
            got = {(a, b): bool(v) for (a, b), v in np.ndenumerate(req[k]) if v >= 0}
            assert got == want
        assert order_changes(req, range(len(p))) == python_min_changes([python_requirements(x) for x in p.tolist()],
                                                                       n)


@pytest.mark.parametrize("n", [8, 9, 12, 17, 32])
def test_rotation_scores_equal_the_recount(n):
    req = crossbar_requirements(round_robin(n))
    rounds = len(req)
    want = [order_changes(req, list(range(s, rounds)) + list(range(s))) for s in range(rounds)]
    assert rotation_changes(req).tolist() == want


@pytest.mark.slow
def test_128_ports_is_a_realizable_one_factorization():
    r = plan_pipswitch(128)
    assert r.realizable and is_one_factorization(r.rounds, 128)
    assert len(r.rounds) == 127 and r.cell_changes <= r.naive_cell_changes
    assert int((r.states[1:] != r.states[:-1]).sum()) == r.cell_changes


def test_to_dict_has_the_contract_keys():
    d = plan_pipswitch(7).to_dict()
    assert {"rounds", "cell_changes", "realizable", "lower_bound_rounds"} <= set(d)
    assert d["realizable"] is True and d["lower_bound_rounds"] == 7 and len(d["rounds"]) == 7
    assert len(d["idle_ports"]) == 7 and sorted(d["idle_ports"]) == list(range(7))


def test_exhaustive_threshold_covers_the_brute_force_sizes():
    assert lower_bound_rounds(7) <= EXHAUSTIVE_ROUNDS


@pytest.mark.parametrize("ports", [1, 0, -3, MAX_PORTS + 1])
def test_too_few_or_too_many_ports_names_the_field(ports):
    with pytest.raises(ScenarioError, match="ports") as e:
        plan_pipswitch(ports)
    assert e.value.field == "ports"


def test_unknown_mesh_names_the_field():
    with pytest.raises(ScenarioError, match="hexagon") as e:
        plan_pipswitch(8, mesh="hexagon")
    assert e.value.field == "mesh" and "crossbar" in str(e.value)
