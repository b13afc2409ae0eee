"""StragglAR's speedup sweep over rank counts x straggler delays x fabrics: it agrees with the
one-case comparison, time is affine in the delay, both speedups (from the early ranks' start and
from the straggler's arrival) match their closed forms, and the CLI validates before it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.collectives.stragglar import lower_bound, stragglar_allreduce
from lightrail.fabric.builders import NVLINK_BANDWIDTH, build_topology
from lightrail.studies.stragglar import fabric_sweep, stragglar_comparison, stragglar_sweep
from lightrail.timing import Engine

SIZE, BW, LAT, ALPHA = 2.0**26, 450e9, 1e-6, 3e-6


def _builder(kind: str):
    return lambda n: build_topology(kind, n, bandwidth=BW, latency=LAT)


def _cells(result, topology, n):
    return sorted((c for c in result["cells"] if c["topology"] == topology and c["ranks"] == n),
                  key=lambda c: c["delay_s"])


def test_every_cell_equals_the_one_case_comparison():
    delays = [0.0, 1e-4, 1e-3, 5e-3]
    kinds = ("switch", "ring", "torus2d", "rails")
    result = stragglar_sweep([8, 4], delays, SIZE, {k: _builder(k) for k in kinds}, alpha=ALPHA).to_dict()
    assert result["ranks"] == [4, 8] and result["delays_s"] == delays and result["topologies"] == list(kinds)
    assert len(result["cells"]) == len(kinds) * 2 * len(delays) and result["skipped"] == []
    for c in result["cells"]:
        one = stragglar_comparison(c["ranks"], SIZE, c["delay_s"], _builder(c["topology"])(c["ranks"]),
                                   alpha=ALPHA).to_dict()
        assert c["stragglar_s"] == pytest.approx(one["stragglar_s"], rel=1e-12)
        assert c["ring_s"] == pytest.approx(one["times_s"]["ring"], rel=1e-12)
        assert c["best_waiting_s"] == pytest.approx(one["wait_then_best_s"], rel=1e-12)
        assert c["wait_then_best"] == one["wait_then_best"]
        for key in ("speedup_over_ring", "speedup_over_best", "speedup_over_ring_after_arrival",
                    "speedup_over_best_after_arrival"):
            assert c[key] == pytest.approx(one[key], rel=1e-12)


def test_on_a_switch_time_is_affine_in_the_delay_and_phase_1_hides_behind_it():
    n = 8
    topology = build_topology("switch", n, bandwidth=BW, latency=LAT)
    # the phase sums, independently: StragglAR's own step times split at its phase-1 boundary
    schedule = stragglar_allreduce(n)
    steps = Engine(topology, alpha=ALPHA).time(schedule, SIZE).step_times
    split = schedule.params["phase1_steps"]
    phase1, phase2 = float(steps[:split].sum()), float(steps[split:].sum())
    assert 0 < phase1 < 1e-3

    delays = sorted(set(np.linspace(0, 4 * phase1, 39).tolist()) | {phase1, 1e-3, 5e-3, 20e-3})
    result = stragglar_sweep([n], delays, SIZE, {"switch": lambda m: topology}, alpha=ALPHA).to_dict()
    cells = _cells(result, "switch", n)
    d = np.array([c["delay_s"] for c in cells])
    ours, ring = np.array([c["stragglar_s"] for c in cells]), np.array([c["ring_s"] for c in cells])
    speedup = np.array([c["speedup_over_ring"] for c in cells])

    assert cells[0]["delay_s"] == 0 and cells[0]["stragglar_s"] == pytest.approx(phase1 + phase2, rel=1e-12)
    assert (np.diff(ours) >= 0).all()  # a later straggler never makes StragglAR finish sooner
    assert ours == pytest.approx(np.maximum(d, phase1) + phase2, rel=1e-12)  # flat until D = phase 1, then slope 1
    assert ring - d == pytest.approx(np.full(len(d), ring[0]), rel=1e-12)  # Ring: D + a constant, slope exactly 1
    hidden = d <= phase1
    assert (np.diff(speedup[hidden]) >= 0).all()  # speedup grows with D while phase 1 is not yet hidden
    assert speedup[hidden][-1] > speedup[0]
    assert speedup[~hidden] == pytest.approx(ring[~hidden] / (d[~hidden] + phase2), rel=1e-12)
    assert speedup.argmax() == np.flatnonzero(d == phase1)[0]  # the peak is at D = phase 1
    assert (np.diff(speedup[~hidden]) <= 0).all() and speedup[-1] > 1  # then it falls towards 1


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_after_arrival_speedup_on_a_switch_is_the_closed_form(n):
    # on a non-blocking switch every round moves one chunk of S/(n-1) per rank: alpha + 2 hops + chunk / B;
    # phase 1 is the early ranks' ring reduce-scatter (n-2 rounds), phase 2 meets the bound n + log2(n) - 2
    step = ALPHA + 2 * LAT + SIZE / (n - 1) / BW
    phase1, phase2 = (n - 2) * step, lower_bound(n) * step
    assert lower_bound(n) == n + n.bit_length() - 3
    ring = 2 * (n - 1) * (ALPHA + 2 * LAT) + 2 * (n - 1) / n * SIZE / BW  # waits for the straggler, then all of it
    delays = [0.0, phase1 / 2, phase1, 2 * phase1, 5e-3]
    result = stragglar_sweep([n], delays, SIZE, {"switch": _builder("switch")}, alpha=ALPHA).to_dict()
    for c in _cells(result, "switch", n):
        d = c["delay_s"]
        ours = max(d, phase1) + phase2
        assert c["stragglar_s"] == pytest.approx(ours, rel=1e-12)
        assert c["speedup_over_ring"] == pytest.approx((d + ring) / ours, rel=1e-12)  # from the early ranks' start
        assert c["speedup_over_ring_after_arrival"] == pytest.approx(ring / (ours - d), rel=1e-12)
        assert c["speedup_over_best_after_arrival"] == pytest.approx((c["best_waiting_s"] - d) / (ours - d),
                                                                     rel=1e-12)
        if d >= phase1:  # phase 1 hidden: the paper's c*alpha + c/(n-1)*S*beta against Ring's whole time
            assert c["speedup_over_ring_after_arrival"] == pytest.approx(ring / phase2, rel=1e-12)
        if c["speedup_over_ring"] > 1:  # the delay, common to both, no longer dilutes the gain
            assert c["speedup_over_ring_after_arrival"] > c["speedup_over_ring"]
    if n >= 8:  # large buffer: 2(n-1)/n * S against (n + log2 n - 2)/(n-1) * S, towards 2x as n grows
        assert 1 < ring / phase2 < 2


def test_fabrics_that_cannot_take_n_are_skipped_with_the_reason():
    result = stragglar_sweep([8, 12], [0.0, 1e-3], SIZE, {"switch": _builder("switch"), "rails": _builder("rails")},
                             alpha=ALPHA).to_dict()
    assert [(s["topology"], s["ranks"]) for s in result["skipped"]] == [("rails", 12)]
    assert "servers of 8" in result["skipped"][0]["reason"]
    assert {(c["topology"], c["ranks"]) for c in result["cells"]} == {("switch", 8), ("switch", 12), ("rails", 8)}


def test_the_cli_writes_the_json_and_both_plots(tmp_path):
    out_dir = tmp_path / "sweep"
    r = CliRunner().invoke(app, ["stragglar", "sweep", "--ranks", "4,8,12", "--straggler-delays", "0,100us,1ms",
                                 "--topologies", "switch,rails", "--at-straggler-delay", "1ms", "--at-ranks", "4",
                                 "--out", str(out_dir), "--json"])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.output)
    written = json.loads((out_dir / "sweep.json").read_text())
    assert printed == written
    assert sorted(p.name for p in out_dir.iterdir()) == ["speedup-vs-delay.png", "speedup-vs-ranks.png",
                                                          "sweep.json"]
    for png in ("speedup-vs-delay.png", "speedup-vs-ranks.png"):
        assert (out_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written["settings"]["at_delay_s"] == 1e-3 and written["settings"]["at_ranks"] == 4
    assert [(s["topology"], s["ranks"]) for s in written["skipped"]] == [("rails", 12)]
    assert len(written["cells"]) == (2 * 3 - 1) * 3
    cell = next(c for c in written["cells"] if (c["topology"], c["ranks"], c["delay_s"]) == ("switch", 8, 1e-3))
    one = stragglar_comparison(8, SIZE, 1e-3, build_topology("switch", 8, bandwidth=BW, latency=LAT),
                               alpha=ALPHA).to_dict()
    assert cell["speedup_over_ring"] == pytest.approx(one["speedup_over_ring"], rel=1e-12)
    assert cell["speedup_over_ring_after_arrival"] == pytest.approx(one["speedup_over_ring_after_arrival"],
                                                                    rel=1e-12)
    for c in written["cells"]:
        assert {"speedup_over_ring", "speedup_over_best", "speedup_over_ring_after_arrival",
                "speedup_over_best_after_arrival", "stragglar_s", "ring_s", "best_waiting_s"} <= c.keys()

    table = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["stragglar", "sweep", "--ranks", "4",
                                                           "--straggler-delays", "0,1ms",
                                                           "--topologies", "switch", "--out", str(tmp_path / "table")])
    assert table.exit_code == 0, table.output
    assert "switch" in table.output and "sweep.json" in table.output
    assert "vs Ring (from start)" in table.output and "vs Ring (after straggler arrives)" in table.output


@pytest.mark.parametrize("args, flag", [
    (["--straggler-delays", "abc"], "--straggler-delays"),
    (["--straggler-delays", ","], "--straggler-delays"),
    (["--straggler-delays", "0,1ms", "--at-straggler-delay", "2ms"], "--at-straggler-delay"),
    (["--straggler-delays", "0,1ms", "--delays", "0"], "--straggler-delays"),  # both spellings at once
    (["--at-straggler-delay", "1ms", "--at-delay", "1ms"], "--at-straggler-delay"),
    (["--topologies", "switch,nosuch"], "--topologies"),
    (["--ranks", "1"], "--ranks"),
    (["--ranks", "4,8", "--at-ranks", "16"], "--at-ranks"),
    (["--size", "64"], "--size"),
    (["--topologies", "rails", "--ranks", "12"], "--ranks"),  # every (fabric, n) skipped: nothing to plot
], ids=["delays", "no-delay", "at-delay", "delays-twice", "at-delay-twice", "topologies", "ranks", "at-ranks",
        "size", "all-skipped"])
def test_bad_flags_exit_2_naming_the_flag_and_write_nothing(tmp_path, args, flag):
    out_dir = tmp_path / "out"
    r = CliRunner().invoke(app, ["stragglar", "sweep", "--ranks", "4", "--straggler-delays", "0,1ms",
                                 "--out", str(out_dir), *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert not out_dir.exists()


def test_the_old_flag_spellings_still_work_with_a_note(tmp_path):
    new = CliRunner().invoke(app, ["stragglar", "sweep", "--ranks", "4,8", "--straggler-delays", "0,1ms",
                                   "--at-straggler-delay", "1ms", "--topologies", "switch",
                                   "--out", str(tmp_path / "new"), "--json"])
    old = CliRunner().invoke(app, ["stragglar", "sweep", "--ranks", "4,8", "--delays", "0,1ms", "--at-delay", "1ms",
                                   "--topologies", "switch", "--out", str(tmp_path / "old"), "--json"])
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.stdout)
    assert "note: --delays is now --straggler-delays" in old.stderr
    assert "note: --at-delay is now --at-straggler-delay" in old.stderr
    assert "note:" not in new.stderr
    help_text = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["stragglar", "sweep", "--help"]).output
    assert "--straggler-delays" in help_text and "--at-delay" not in help_text and "--delays" not in help_text


def test_fabric_sweep_picks_the_slices_and_its_rows_are_the_table():
    result = fabric_sweep([4, 8, 16], [0.0, 250e-6, 1e-3], SIZE, ["switch", "switch", "ring"], bandwidth=BW,
                          latency=LAT, alpha=ALPHA)
    assert result.topologies == ("switch", "ring")
    assert (result.settings.at_delay_s, result.settings.at_ranks) == (250e-6, 8)  # the defaults
    assert [(c.topology, c.ranks) for c in result.rows()] == [(t, n) for t in ("switch", "ring") for n in (4, 8, 16)]
    assert all(c.delay_s == 250e-6 for c in result.rows())
    as_dict = result.to_dict()
    assert as_dict["settings"] == {"bandwidth_Bps": BW, "latency_s": LAT, "gpus_per_server": 8,
                                   "nvlink_bandwidth_Bps": NVLINK_BANDWIDTH, "hosts_per_leaf": 32,
                                   "at_delay_s": 250e-6, "at_ranks": 8}
    assert json.loads(json.dumps(as_dict)) == as_dict  # plain JSON: lists, not tuples
    picked = fabric_sweep([4, 16], [0.0, 1e-3], SIZE, ["switch"], bandwidth=BW, latency=LAT,
                          at_delay=1e-3 * (1 + 1e-12))
    assert (picked.settings.at_delay_s, picked.settings.at_ranks) == (1e-3, 4)


def test_the_old_names_of_stragglars_study_still_import():
    """Issue 32 spelled the study StragglAR's way; the names code may already use stay, as the same objects."""
    from lightrail.studies import stragglar, stragglar_run, straggler_run

    assert (stragglar.StragglerSweep, stragglar.StragglerComparison, stragglar.StragglerTimes) == (
        stragglar.StragglarSweep, stragglar.StragglarComparison, stragglar.StragglarTimes)
    assert (stragglar.straggler_sweep, stragglar.straggler_comparison, stragglar.straggler_times) == (
        stragglar_sweep, stragglar_comparison, stragglar.stragglar_times)
    assert (straggler_run.StragglerRun, straggler_run.measure_straggler, straggler_run.METHODS) == (
        stragglar_run.StragglarRun, stragglar_run.measure_stragglar, stragglar_run.METHODS)
