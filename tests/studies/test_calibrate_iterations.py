"""``lightrail calibrate iterations``: fitting mfu and the control plane's costs to measured iteration times.

The tables are made by the model itself with known parameters (mfu 0.3, check-in round trip 2 ms, command latency
5 ms) on a 16-GPU debug job whose compute is about half of its electrical iteration (a 20 TFLOP/s GPU), so mfu
moves the electrical rows; the scenario the fit starts from holds other values (0.5, 420 us, 930 us). The job's
program is the gradient buckets without Megatron's step (megatron_step: false), the one these figures were made on:
with the step's tp+pp phase the 0 and 1 ms rows no longer sit on one linear piece of the round trip."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.defaults import Mode
from lightrail.scenario import parse_scenario
from lightrail.studies.calibrate_iterations import TableRow, fit_iterations, parse_iteration_table
from lightrail.studies.rails import JobRuns

SCENARIO = """name: calib-tiny
model: {preset: debug, overrides: {layers: 4}}
cluster: {gpus: 16, gpus_per_server: 4, gpu: h100, peak_tflops: 20}
parallel: {tp: 4, pp: 2, dp: 2}
job: {micro_batches: 4, mfu: 0.5, megatron_step: false}
ocs: {reconfig_delay: 1ms, mode: on-demand, check_in_rtt: 420us, command_latency: 930us}
"""
TRUE = {"mfu": 0.3, "check_in_rtt_s": 2e-3, "command_latency_s": 5e-3}
DELAYS = ((0.0, "0"), (1e-3, "1ms"), (1e-2, "10ms"), (1e-1, "100ms"))
runner = CliRunner()


@pytest.fixture(scope="module")
def built():
    import yaml

    return parse_scenario(yaml.safe_load(SCENARIO)).build()


@pytest.fixture(scope="module")
def truth(built) -> list[tuple[str, float | None, str, float]]:
    """(mode, delay, delay as written, iteration time) of every row, simulated with the true parameters."""
    runs = JobRuns(replace(built.job, mfu=TRUE["mfu"]))
    fabric = replace(built.fabric, check_in_rtt=TRUE["check_in_rtt_s"], command_latency=TRUE["command_latency_s"])
    rows = [("electrical", None, "", runs.electrical(fabric).iteration_time_s)]
    for mode in ("on-demand", "provisioned"):
        for delay, text in DELAYS:
            r = runs(replace(fabric, ocs_delay=delay), replace(built.params, mode=Mode(mode)))
            rows.append((mode, delay, text, r.iteration_time_s))
    return rows


def _rows(truth, noise: float = 0.0, seed: int = 0) -> tuple[TableRow, ...]:
    rng = np.random.default_rng(seed)
    return tuple(TableRow(mode, delay, t * (1 + noise * rng.standard_normal()), line)
                 for line, (mode, delay, _, t) in enumerate(truth, 1))


def _csv(truth) -> str:
    lines = ["# made by the model: mfu 0.3, check_in_rtt 2ms, command_latency 5ms", "mode,ocs_delay,iteration_s"]
    return "\n".join(lines + [f"{mode},{text},{t!r}" for mode, _, text, t in truth]) + "\n"


def test_fit_recovers_the_parameters_that_made_the_table(built, truth):
    """Iteration time is piecewise linear in the two latencies, so inside one linear piece least squares lands on
    them to rounding; mfu comes from a bounded Brent search with xatol 1e-7 on log(mfu). 1e-4 relative leaves
    room for both; the rows outside the fit (10 ms, 100 ms) are then predicted exactly."""
    cal = fit_iterations(built, _rows(truth), fit_delays=[0.0, 1e-3])
    for key, value in TRUE.items():
        assert cal.fitted[key] == pytest.approx(value, rel=1e-4), key
    assert all(cal.identified.values()) and cal.warnings == []
    assert [r["used_in_fit"] for r in cal.rows] == [True] + [d in (0.0, 1e-3) for _ in range(2) for d, _ in DELAYS]
    assert cal.rms_relative_error["out_of_fit"] < 1e-6
    assert cal.rms_relative_error["all"] < 1e-6
    # electrical runs of the fit share op durations across mfu values: the same time as a fresh simulation
    fresh = JobRuns(replace(built.job, mfu=cal.fitted["mfu"])).electrical(built.fabric).iteration_time_s
    assert cal.rows[0]["predicted_s"] == pytest.approx(fresh, rel=1e-12)


def test_fit_with_two_percent_noise_stays_close(built, truth):
    """2% noise on every row: the two latencies move the rows nearly in step (slopes 5 and 3 on demand, 4 and 2
    provisioned, per second of each), so each alone is known to a few tens of percent; the predictions, which is
    what a user takes away, stay within the noise."""
    cal = fit_iterations(built, _rows(truth, noise=0.02), fit_delays=[0.0, 1e-3, 1e-2])
    assert cal.fitted["mfu"] == pytest.approx(TRUE["mfu"], rel=0.1)
    assert cal.fitted["check_in_rtt_s"] == pytest.approx(TRUE["check_in_rtt_s"], rel=0.35)
    assert cal.fitted["command_latency_s"] == pytest.approx(TRUE["command_latency_s"], rel=0.35)
    assert cal.rms_relative_error["out_of_fit"] < 0.03
    exact = {(mode, delay): t for mode, delay, _, t in truth}
    for row in cal.rows:
        assert row["predicted_s"] == pytest.approx(exact[row["mode"], row["delay_s"]], rel=0.03)


def test_rows_of_one_mode_cannot_separate_the_latencies(built, truth):
    """On demand alone, both latencies add to every row in the same proportion: only a combination is known, so
    the check-in round trip keeps the scenario's value and the command latency absorbs the rest."""
    rows = [r for r in _rows(truth) if r.mode != "provisioned"]
    cal = fit_iterations(built, rows)
    assert not cal.identified["check_in_rtt_s"] and cal.identified["command_latency_s"]
    assert cal.fitted["check_in_rtt_s"] == built.fabric.check_in_rtt
    assert any("not separated" in w for w in cal.warnings)
    assert cal.rms_relative_error["all"] < 1e-6


def test_without_electrical_rows_mfu_keeps_the_scenario_value(built, truth):
    cal = fit_iterations(built, [r for r in _rows(truth) if r.mode != "electrical"], fit_delays=[0.0])
    assert cal.fitted["mfu"] == built.job.mfu and not cal.identified["mfu"]
    assert any("mfu is not identified" in w for w in cal.warnings)


def test_table_comments_header_and_units():
    rows = parse_iteration_table("# testbed\n\nelectrical,,0.5\n# note\nprovisioned, 0 ,0.6\non_demand,1s,700ms\n")
    assert rows[:2] == (TableRow("electrical", None, 0.5, 3), TableRow("provisioned", 0.0, 0.6, 5))
    assert (rows[2].mode, rows[2].delay_s, rows[2].line) == ("on-demand", 1.0, 6)
    assert rows[2].measured_s == pytest.approx(0.7)


def test_cli_json_contract_and_files(tmp_path, monkeypatch, truth):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.csv").write_text(_csv(truth))
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    args = ["calibrate", "iterations", "table.csv", "tiny.yaml", "--fit-delays", "10ms,100ms"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["fitted"]) == {"mfu", "check_in_rtt_s", "command_latency_s"}
    assert len(data["rows"]) == len(truth)
    for row in data["rows"]:
        assert {"mode", "delay_s", "measured_s", "predicted_s", "relative_error", "used_in_fit"} <= set(row)
    assert data["rows"][0]["delay_s"] is None and data["rows"][0]["used_in_fit"] is True
    assert {"out_of_fit", "all"} <= set(data["rms_relative_error"])
    assert data["rms_relative_error"]["out_of_fit"] < 1e-6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv", "tiny.yaml"]  # --json alone writes nothing
    result = runner.invoke(app, [*args, "--out", "fit"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "fit").iterdir()) == ["calibration.json", "calibration.png",
                                                                    "calibration.yaml"]
    import yaml

    fragment = yaml.safe_load((tmp_path / "fit" / "calibration.yaml").read_text())
    assert fragment["job"]["mfu"] == pytest.approx(0.3, rel=1e-4)
    assert set(fragment["ocs"]) == {"check_in_rtt", "command_latency"}
    merged = yaml.safe_load(SCENARIO)
    for section, fields in fragment.items():
        merged[section].update(fields)  # the fragment pastes into a scenario
    assert parse_scenario(merged).build().fabric.command_latency == pytest.approx(5e-3, rel=1e-4)


@pytest.mark.parametrize(("line", "said"), [
    ("warp,10ms,0.1", "unknown mode"),
    ("on-demand,10,0.1", "no unit"),
    ("provisioned,10ms,fast", "not a number"),
    ("electrical,10ms,0.1", "electrical row has an OCS delay"),
    ("provisioned,,0.1", "needs its OCS delay"),
    ("provisioned,10ms", "columns"),
])
def test_bad_table_exits_2_naming_the_line(tmp_path, monkeypatch, line, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.csv").write_text(f"# testbed\nelectrical,,0.01\n{line}\n")
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    result = runner.invoke(app, ["calibrate", "iterations", "table.csv", "tiny.yaml", "--out", "fit"])
    assert result.exit_code == 2, result.output
    assert "TABLE:3" in result.output and said in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "fit").exists()


def test_fit_delays_not_in_the_table_exit_2(tmp_path, monkeypatch, truth):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.csv").write_text(_csv(truth))
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    result = runner.invoke(app, ["calibrate", "iterations", "table.csv", "tiny.yaml", "--fit-delays", "1s"])
    assert result.exit_code == 2, result.output
    assert "--fit-delays" in result.output and "10ms" in result.output
    assert not (tmp_path / "out").exists()
