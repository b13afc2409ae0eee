"""StragglAR synthesis (work in progress): correct for every n, rounds never below the lower bound."""

from __future__ import annotations

import pytest

from lightrail.collectives import verify
from lightrail.collectives.schedule import Op
from lightrail.collectives.stragglar import lower_bound, phase2_rounds, stragglar_allreduce


@pytest.mark.parametrize("n", list(range(2, 41)))
def test_stragglar_is_a_proven_allreduce_for_every_n(n):
    schedule = stragglar_allreduce(n)
    assert verify(schedule).kind == "allreduce"
    assert schedule.params["phase1_steps"] == n - 2  # ring reduce-scatter among the n-1 early ranks


@pytest.mark.parametrize("n", list(range(2, 41)))
def test_each_rank_sends_and_receives_at_most_one_chunk_per_round(n):
    rounds = phase2_rounds(n)
    assert len(rounds) >= lower_bound(n)
    for t, moves in enumerate(rounds):
        senders = [u for u, _, _, _ in moves]
        receivers = [v for _, v, _, _ in moves]
        assert len(senders) == len(set(senders)) and len(receivers) == len(set(receivers))
        if t < n - 1:  # the straggler swaps chunk t with rank t
            assert (n - 1, t, t, Op.REDUCE) in moves and (t, n - 1, t, Op.REDUCE) in moves


def test_small_n_meet_the_lower_bound():
    for n in (2, 3, 4, 5):
        assert len(phase2_rounds(n)) == lower_bound(n)
    assert [lower_bound(n) for n in (2, 4, 8, 16, 32)] == [1, 4, 9, 18, 35]  # n + log2(n) - 2
