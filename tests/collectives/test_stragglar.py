"""StragglAR synthesis: a proven AllReduce for every n, one send and one receive per rank per round,
phase-2 rounds equal to the lower bound at every power of two, within 3 of it at other n up to 256,
and never more than the greedy took before the power-of-two construction
(tests/data/stragglar_rounds_before.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lightrail.collectives import generate, verify
from lightrail.collectives.schedule import Combine
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


POWERS_OF_TWO = [2**k for k in range(2, 11)]
BEFORE = {int(n): r for n, r in json.loads(
    (Path(__file__).parents[1] / "data" / "stragglar_rounds_before.json").read_text())["rounds"].items()}


def _check_rounds(n: int) -> None:
    p = phase2(n)
    assert lower_bound(n) <= p.rounds <= lower_bound(n) + 3
    if n & (n - 1) == 0:
        assert p.rounds == lower_bound(n)
    for end in (p.src, p.dst):  # nobody sends (receives) twice in a round
        assert len(np.unique(p.round.astype(np.int64) * n + end)) == len(end)
    swap = p.combine == Combine.REDUCE  # round t < n-1: the straggler swaps chunk t with rank t, its only transfer
    assert sorted(zip(p.round[swap], p.src[swap], p.dst[swap], p.chunk[swap], strict=True)) == sorted(
        [(t, n - 1, t, t) for t in range(n - 1)] + [(t, t, n - 1, t) for t in range(n - 1)])
    straggler_copies = ~swap & ((p.src == n - 1) | (p.dst == n - 1))
    assert (p.round[straggler_copies] >= n - 1).all()


@pytest.mark.parametrize("n", list(range(2, 65)) + [100, 127, 128, 200, 255, 256])
def test_one_send_and_one_receive_per_rank_per_round_within_three_of_the_bound(n):
    _check_rounds(n)


def _check_power_of_two(n: int) -> None:
    p = phase2(n)
    assert p.rounds == lower_bound(n) == n + n.bit_length() - 3  # n + log2(n) - 2
    _check_rounds(n)
    schedule = stragglar_allreduce(n)
    assert verify(schedule).kind == "allreduce"
    assert schedule.nsteps == n - 2 + lower_bound(n)
    # nothing wasted: each chunk reaches each early rank once (n-2 copies per chunk) besides the swaps
    copies = p.combine == Combine.COPY
    assert copies.sum() == (n - 1) * (n - 2)
    assert len(np.unique(p.chunk[copies].astype(np.int64) * n + p.dst[copies])) == copies.sum()
    # after round n-2 the straggler only sends the last chunk, once per round, to a rank still lacking it
    late = p.src == n - 1
    assert (p.chunk[late & (p.round >= n - 1)] == n - 2).all() and not (p.dst[copies] == n - 1).any()


@pytest.mark.parametrize("n", [n for n in POWERS_OF_TWO if n <= 256])
def test_powers_of_two_meet_the_lower_bound_and_are_proven(n):
    _check_power_of_two(n)


@pytest.mark.slow
@pytest.mark.parametrize("n", [512, 1024])
def test_512_and_1024_ranks_meet_the_lower_bound_and_are_proven(n):
    _check_power_of_two(n)


def test_never_more_rounds_than_the_previous_generator():
    assert BEFORE[1024] == 1035 and len(BEFORE) >= 255  # the recorded greedy (gaps 1-3 at powers of two)
    worse = {n: (phase2(n).rounds, old) for n, old in BEFORE.items() if n <= 256 and phase2(n).rounds > old}
    assert worse == {}
    better = [n for n in POWERS_OF_TWO if n <= 256 and phase2(n).rounds < BEFORE[n]]
    assert better == [8, 16, 32, 64, 128, 256]


def test_lower_bound_values_and_small_n_meet_it():
    assert [lower_bound(n) for n in (2, 4, 8, 16, 32, 64)] == [1, 4, 9, 18, 35, 68]  # n + log2(n) - 2
    assert [lower_bound(n) for n in (3, 5, 6, 7)] == [3, 6, 7, 8]  # n + ceil(log2 n) - 2 (>= n)
    for n in (2, 3, 4, 5):
        assert phase2(n).rounds == lower_bound(n)
    hits = sum(phase2(n).rounds == lower_bound(n) for n in range(2, 257))
    assert hits >= 106  # every power of two, and the greedy at 98 other n of 2..256
    with pytest.raises(UnsupportedError, match="at least 2"):
        phase2(1)


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
    from typer.testing import CliRunner

    from lightrail.cli import app

    runner = CliRunner()
    one = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "16", "--json"]).output)
    assert one == {"ranks": 16, "rounds": phase2(16).rounds, "lower_bound": lower_bound(16)}
    table = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "2..9", "--json"]).output)["rows"]
    assert [r["ranks"] for r in table] == list(range(2, 10))
    powers = json.loads(runner.invoke(app, ["stragglar", "rounds", "--ranks", "4,8,16,32,64,128,256,512,1024",
                                            "--json"]).output)["rows"]
    assert [r["rounds"] - r["lower_bound"] for r in powers] == [0] * 9
    for bad in ("1", "x", "5..2"):
        r = runner.invoke(app, ["stragglar", "rounds", "--ranks", bad])
        assert r.exit_code == 2 and "--ranks" in r.output

    n, size, delay, bw, lat, alpha = 8, 2**26, 5e-3, 450e9, 1e-6, 3e-6
    result = runner.invoke(app, ["stragglar", "compare", "--ranks", str(n), "--size", "64MiB",
                                 "--straggler-delay", "5ms", "--topology", "switch", "--bandwidth", "450GBps",
                                 "--latency", "1us", "--alpha", "3us", "--json"])
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
    # both speedups, named apart: from the early ranks' start, and from the straggler's arrival (the paper's)
    ours = max(delay, out["stragglar_phase1_s"]) + out["stragglar_phase2_s"]
    assert out["speedup_over_ring"] == pytest.approx((delay + ring) / ours)
    assert out["speedup_over_ring_after_arrival"] == pytest.approx(ring / (ours - delay))
    assert out["speedup_over_best_after_arrival"] == pytest.approx(
        (out["wait_then_best_s"] - delay) / (ours - delay))
    assert out["stragglar_after_arrival_s"] == pytest.approx(ours - delay)
    assert {"speedup_over_ring", "speedup_over_best", "speedup_over_ring_after_arrival",
            "speedup_over_best_after_arrival", "times_s", "wait_then_best", "wait_then_best_s"} <= out.keys()
    table = runner.invoke(app, ["stragglar", "compare", "--ranks", "8", "--straggler-delay", "250us"])
    assert table.exit_code == 0, table.output
    assert "from start" in table.output and "after straggler arrives" in table.output


def test_compare_takes_the_old_delay_spelling_with_a_note_but_not_both():
    from typer.testing import CliRunner

    from lightrail.cli import app

    runner = CliRunner()
    new = runner.invoke(app, ["stragglar", "compare", "--ranks", "8", "--straggler-delay", "250us", "--json"])
    old = runner.invoke(app, ["stragglar", "compare", "--ranks", "8", "--delay", "250us", "--json"])
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.stdout) and json.loads(new.stdout)["delay_s"] == 250e-6
    assert "note: --delay is now --straggler-delay" in old.stderr and "note:" not in new.stderr
    for args in (["--delay", "1ms", "--straggler-delay", "1ms"], ["--straggler-delay", "soon"],
                 ["--straggler-delay", "-1ms"]):
        r = runner.invoke(app, ["stragglar", "compare", *args])
        assert r.exit_code == 2 and "--straggler-delay" in r.stderr and "Traceback" not in r.output, r.output
