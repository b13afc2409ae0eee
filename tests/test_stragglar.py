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


def test_rounds_and_compare_from_the_cli():
    import json

    from typer.testing import CliRunner

    from lightrail.cli import app

    runner = CliRunner()
    one = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "16", "--json"]).output)
    assert one == {"ranks": 16, "rounds": len(phase2_rounds(16)), "lower_bound": lower_bound(16)}
    table = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "2..9", "--json"]).output)["rows"]
    assert [r["ranks"] for r in table] == list(range(2, 10))
    for bad in ("1", "x", "5..2"):
        r = runner.invoke(app, ["stragglar", "rounds", "--ranks", bad])
        assert r.exit_code == 2 and "--ranks" in r.output

    n, size, delay, bw, lat, alpha = 8, 2**26, 5e-3, 450e9, 1e-6, 3e-6
    result = runner.invoke(app, ["stragglar", "compare", "--ranks", str(n), "--size", "64MiB", "--delay", "5ms",
                                 "--topology", "switch", "--bandwidth", "450GBps", "--latency", "1us", "--alpha", "3us",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    # on a non-blocking switch every phase-2 round moves one chunk per rank: alpha + 2 hops + chunk / B
    rounds = len(phase2_rounds(n))
    assert out["stragglar_phase2_s"] == pytest.approx(rounds * (alpha + 2 * lat + size / (n - 1) / bw))
    assert out["stragglar_s"] == pytest.approx(max(delay, out["stragglar_phase1_s"]) + out["stragglar_phase2_s"])
    ring = 2 * (n - 1) * (alpha + 2 * lat) + 2 * (n - 1) / n * size / bw
    assert out["times_s"]["ring"] == pytest.approx(delay + ring)
    assert out["stragglar_phase2_s"] < ring  # after the straggler arrives, StragglAR needs less than a whole Ring
    assert out["speedup_over_ring"] > 1
