"""StragglAR synthesis: a proven AllReduce for every n, one send and one receive per rank per round,
and phase-2 rounds within 3 of the lower bound."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.collectives import generate, verify
from lightrail.collectives.schedule import Op
from lightrail.collectives.stragglar import lower_bound, phase2, stragglar_allreduce
from lightrail.errors import UnsupportedError


@pytest.mark.parametrize("block", [range(2, 65), range(65, 129), range(129, 193), range(193, 257)],
                         ids=lambda b: f"{b.start}..{b.stop - 1}")
def test_stragglar_is_a_proven_allreduce_for_every_n_up_to_256(block):
    for n in block:
        schedule = stragglar_allreduce(n)
        assert verify(schedule).kind == "allreduce"
        assert schedule.params["phase1_steps"] == max(n - 2, 0)  # ring reduce-scatter among the n-1 early ranks
        assert schedule.nsteps == schedule.params["phase1_steps"] + phase2(n).rounds


def _check_rounds(n: int) -> None:
    p = phase2(n)
    assert lower_bound(n) <= p.rounds <= lower_bound(n) + 3
    for end in (p.src, p.dst):  # nobody sends (receives) twice in a round
        assert len(np.unique(p.round.astype(np.int64) * n + end)) == len(end)
    swap = p.op == Op.REDUCE  # round t < n-1: the straggler swaps chunk t with rank t, its only transfer
    assert sorted(zip(p.round[swap], p.src[swap], p.dst[swap], p.chunk[swap], strict=True)) == sorted(
        [(t, n - 1, t, t) for t in range(n - 1)] + [(t, t, n - 1, t) for t in range(n - 1)])
    straggler_copies = ~swap & ((p.src == n - 1) | (p.dst == n - 1))
    assert (p.round[straggler_copies] >= n - 1).all()


@pytest.mark.parametrize("n", list(range(2, 65)) + [100, 127, 128, 200, 255, 256])
def test_one_send_and_one_receive_per_rank_per_round_within_three_of_the_bound(n):
    _check_rounds(n)


@pytest.mark.slow
def test_1024_ranks_synthesise_and_verify_within_three_rounds_of_the_bound():
    _check_rounds(1024)
    verify(generate("allreduce", "stragglar", 1024))


def test_lower_bound_values_and_small_n_meet_it():
    assert [lower_bound(n) for n in (2, 4, 8, 16, 32, 64)] == [1, 4, 9, 18, 35, 68]  # n + log2(n) - 2
    assert [lower_bound(n) for n in (3, 5, 6, 7)] == [3, 6, 7, 8]  # n + ceil(log2 n) - 2 (>= n)
    for n in (2, 3, 4, 5):
        assert phase2(n).rounds == lower_bound(n)
    hits = sum(phase2(n).rounds == lower_bound(n) for n in range(2, 257))
    assert hits >= 100  # the greedy meets the bound for 100 of n = 2..256


def test_any_rank_can_be_the_straggler():
    for n in (2, 3, 6, 9):
        for k in range(n):
            schedule = stragglar_allreduce(n, straggler=k)
            assert verify(schedule).kind == "allreduce"
            assert schedule.params["straggler"] == k
            phase1 = np.arange(schedule.ntransfers) < schedule.step_ptr[schedule.params["phase1_steps"]]
            assert not ((schedule.src[phase1] == k) | (schedule.dst[phase1] == k)).any()  # phase 1 never waits on it
    with pytest.raises(UnsupportedError, match="straggler"):
        stragglar_allreduce(4, straggler=4)
    with pytest.raises(UnsupportedError, match="straggler"):
        generate("allreduce", "stragglar", 4, straggler=-1)


def test_rounds_and_compare_from_the_cli():
    import json

    from typer.testing import CliRunner

    from lightrail.cli import app

    runner = CliRunner()
    one = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "16", "--json"]).output)
    assert one == {"ranks": 16, "rounds": phase2(16).rounds, "lower_bound": lower_bound(16)}
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
    rounds = phase2(n).rounds
    assert out["stragglar_phase2_s"] == pytest.approx(rounds * (alpha + 2 * lat + size / (n - 1) / bw))
    assert out["stragglar_s"] == pytest.approx(max(delay, out["stragglar_phase1_s"]) + out["stragglar_phase2_s"])
    ring = 2 * (n - 1) * (alpha + 2 * lat) + 2 * (n - 1) / n * size / bw
    assert out["times_s"]["ring"] == pytest.approx(delay + ring)
    assert out["stragglar_phase2_s"] < ring  # after the straggler arrives, StragglAR needs less than a whole Ring
    assert out["speedup_over_ring"] > 1
