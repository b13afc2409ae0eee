"""Scenario files and the simulate / sweep / check verbs, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.scenario import DEFAULT_SCENARIO, load_scenario, parse_scenario

runner = CliRunner()
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
TINY = Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_a_valid_scenario(path):
    result = run("check", path)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok:")


def test_default_example_file_is_the_embedded_default():
    scenario, _ = load_scenario(Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-2048xh200.yaml")
    default, _ = load_scenario(None)
    a, b = scenario.build(), default.build()
    assert (a.job, a.fabric, a.params) == (b.job, b.fabric, b.params)


def test_simulate_json_has_the_promised_keys_and_consistent_values(tmp_path):
    result = run("simulate", TINY, "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in ("iteration_time_s", "baseline_iteration_time_s", "overhead", "reconfigurations_per_iteration",
                "power_ratio", "cost_ratio", "overhead_breakdown_s", "controller_round_trips_per_iteration",
                "program_ops"):
        assert key in out
    assert set(out["program_ops"]) == {"by_dim", "by_name"}
    assert sum(out["program_ops"]["by_dim"].values()) == sum(out["program_ops"]["by_name"].values()) > 0
    assert out["overhead"] == pytest.approx(out["iteration_time_s"] / out["baseline_iteration_time_s"] - 1)
    # the breakdown adds up to the photonic minus the electrical iteration, for the run and every ablation row
    assert set(out["overhead_breakdown_s"]) == {"switching_delay_s", "drain_wait_s", "control_plane_s",
                                                "lost_overlap_s"}
    assert sum(out["overhead_breakdown_s"].values()) == pytest.approx(
        out["iteration_time_s"] - out["baseline_iteration_time_s"], rel=1e-9, abs=1e-12)
    for row in out["ablation"]:
        assert sum(row["overhead_breakdown_s"].values()) == pytest.approx(
            row["iteration_time_s"] - out["baseline_iteration_time_s"], rel=1e-9, abs=1e-12)
    assert out["ablation"][0]["controller_round_trips_per_iteration"] > out["controller_round_trips_per_iteration"]
    assert out["power_ratio"] > 1 and out["cost_ratio"] > 1
    assert out["ablation"][-1]["iteration_time_s"] == pytest.approx(out["iteration_time_s"])  # all knobs = default
    assert json.loads((tmp_path / "summary.json").read_text()) == out
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("pid") == 2 and e["ph"] == "X" for e in trace["traceEvents"])
    assert (tmp_path / "breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_no_ablation_keeps_every_key_and_value_but_the_ablation_rows(tmp_path):
    """The contract: ``simulate --no-ablation --json`` is today's JSON with an empty ablation, every other value the
    same; nothing is plotted for the ablation, and the table leaves its two tables out."""
    full = json.loads(run("simulate", TINY, "--json").output)
    lean = run("simulate", TINY, "--json", "--no-ablation", "--out", tmp_path)
    assert lean.exit_code == 0, lean.output
    lean = json.loads(lean.output)
    assert list(lean) == list(full) and full["ablation"] and lean["ablation"] == []
    assert {k: v for k, v in lean.items() if k != "ablation"} == {k: v for k, v in full.items() if k != "ablation"}
    assert (tmp_path / "breakdown.png").is_file() and not (tmp_path / "overhead.png").exists()
    table = run("simulate", TINY, "--no-ablation", "--out", tmp_path)
    assert table.exit_code == 0 and "policy ablation" not in table.output and "iteration time" in table.output


def test_simulate_table_compares_the_two_fabrics(tmp_path):
    result = run("simulate", TINY, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    for text in ("electrical rails", "photonic rails", "overhead", "reconfigurations", "power", "cost",
                 "policy ablation", "opus (original)"):
        assert text in result.output


def test_delay_and_mode_overrides(tmp_path):
    slow = json.loads(run("simulate", TINY, "--ocs-delay", "100ms", "--mode", "on-demand", "--out", tmp_path,
                          "--json").output)
    fast = json.loads(run("simulate", TINY, "--ocs-delay", "0", "--out", tmp_path, "--json").output)
    assert slow["reconfig_delay_s"] == 0.1 and slow["mode"] == "on-demand"
    assert slow["iteration_time_s"] > fast["iteration_time_s"]
    # at zero delay the photonic rail is the ideal one plus its controller round trips
    assert fast["overhead_breakdown_s"]["switching_delay_s"] == 0
    assert fast["iteration_time_s"] - fast["ideal_iteration_time_s"] == pytest.approx(
        fast["overhead_breakdown_s"]["control_plane_s"], abs=1e-12)


def test_sweep_rows_cover_every_delay_and_mode(tmp_path):
    result = run("sweep", TINY, "--ocs-delays", "0,1ms,10ms,100ms", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    mine = [r for r in rows if r["policy"] == "lightrail"]
    assert {(r["delay_s"], r["mode"]) for r in mine} == {(d, m) for d in (0, 1e-3, 1e-2, 0.1)
                                                         for m in ("on-demand", "provisioned")}
    for mode in ("on-demand", "provisioned"):
        series = [r["overhead"] for r in sorted((r for r in mine if r["mode"] == mode), key=lambda r: r["delay_s"])]
        assert series == sorted(series)
    for r in rows:
        assert {"delay_s", "mode", "iteration_time_s", "overhead"} <= set(r)
    assert (tmp_path / "overhead.png").exists() and (tmp_path / "sweep.json").exists()


BAD = {
    "unknown field": ({**DEFAULT_SCENARIO, "colour": "blue"}, "colour"),
    "unknown nested field": ({**DEFAULT_SCENARIO, "job": {"micro_batches": 4, "microbatch": 2}}, "job.microbatch"),
    "missing model": ({k: v for k, v in DEFAULT_SCENARIO.items() if k != "model"}, "model"),
    "unknown model": ({**DEFAULT_SCENARIO, "model": "llama9"}, "model"),
    "impossible layout": ({**DEFAULT_SCENARIO, "parallel": {"tp": 8, "pp": 8, "dp": 16}}, "parallel"),
    "tp beyond a server": ({**DEFAULT_SCENARIO, "parallel": {"tp": 16, "pp": 8, "dp": 16}}, "parallel.tp"),
    "layers and pp": ({**DEFAULT_SCENARIO, "parallel": {"tp": 8, "pp": 32, "dp": 8}}, "parallel.pp"),
    "unit error": ({**DEFAULT_SCENARIO, "ocs": {"reconfig_delay": "10"}}, "ocs.reconfig_delay"),
    "wrong unit": ({**DEFAULT_SCENARIO, "cluster": {**DEFAULT_SCENARIO["cluster"], "rail_bandwidth": "400GB"}},
                   "cluster.rail_bandwidth"),
    "bad mode": ({**DEFAULT_SCENARIO, "ocs": {"mode": "sometimes"}}, "ocs.mode"),
    "unknown cost fact": ({**DEFAULT_SCENARIO, "costs": {"unicorn_price": 3}}, "costs.unicorn_price"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_exit_2_naming_the_field_and_write_nothing(case, tmp_path):
    data, field = BAD[case]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    out_dir = tmp_path / "out"
    for verb in ("simulate", "sweep"):
        result = run(verb, path, "--out", out_dir)
        assert result.exit_code == 2, result.output
        assert field in result.output
        assert "Traceback" not in result.output
    assert not out_dir.exists()


def test_unreadable_scenarios_exit_2(tmp_path):
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    for name in ("broken.yaml", "list.yaml", "missing.yaml"):
        result = run("simulate", tmp_path / name, "--out", tmp_path / "out")
        assert result.exit_code == 2 and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_parse_scenario_errors_are_scenario_errors():
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**DEFAULT_SCENARIO, "job": {}})
    assert info.value.field == "job.micro_batches"


def test_hf_config_model_relative_to_the_scenario(tmp_path):
    data = Path(__file__).resolve().parents[1] / "data"
    config = next(data.glob("llama3-8b*.json"))
    (tmp_path / "config.json").write_text(config.read_text())
    scenario = {**DEFAULT_SCENARIO, "model": {"hf_config": "config.json", "seq_len": 8192},
                "cluster": {"gpus": 64, "gpu": "h100"},
                "parallel": {"tp": 8, "pp": 4, "dp": 2}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    loaded, base = load_scenario(tmp_path / "s.yaml")
    assert loaded.build(base).model.layers == 32


def test_cost_table_across_cluster_sizes():
    result = run("cost", "--gpus", "256..16384", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["gpus"] for r in rows] == [256 * 2**k for k in range(7)]
    for r in rows:
        assert r["power_ratio"] == pytest.approx(r["electrical_power_w"] / r["photonic_power_w"])
        assert r["cost_ratio"] == pytest.approx(r["electrical_capex_usd"] / r["photonic_capex_usd"])
        assert r["power_ratio"] > 1 and r["cost_ratio"] > 1
    assert [r["electrical_tiers"] for r in rows] == sorted(r["electrical_tiers"] for r in rows)
    for bad in ("12x", "100..10", "abc..1"):
        assert run("cost", "--gpus", bad).exit_code == 2


RENAMED = {"simulate": ("--delay", "--ocs-delay", "10ms"), "sweep": ("--delays", "--ocs-delays", "0,10ms")}


@pytest.mark.parametrize("verb", sorted(RENAMED))
def test_old_flag_spelling_still_works_and_says_so(verb, tmp_path):
    old, new, value = RENAMED[verb]
    before = run(verb, TINY, old, value, "--out", tmp_path / "old", "--json")
    after = run(verb, TINY, new, value, "--out", tmp_path / "new", "--json")
    assert before.exit_code == 0 and after.exit_code == 0, before.output + after.output
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert f"note: {old} is now {new}" in before.stderr and "note:" not in after.stderr
    help_text = run(verb, "--help").output
    assert new in help_text and f"{old} " not in help_text


@pytest.mark.parametrize("verb", sorted(RENAMED))
def test_both_spellings_at_once_exit_2_and_write_nothing(verb, tmp_path):
    old, new, value = RENAMED[verb]
    result = run(verb, TINY, old, value, new, value, "--out", tmp_path / "out")
    assert result.exit_code == 2 and f"error: {new}" in result.output and "given twice" in result.output
    assert not (tmp_path / "out").exists()


def test_mode_reads_the_old_on_demand_spelling(tmp_path):
    result = run("simulate", TINY, "--mode", "on_demand", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mode"] == "on-demand"
    bad = run("simulate", TINY, "--mode", "sometimes", "--out", tmp_path / "out")
    assert bad.exit_code == 2 and "error: --mode" in bad.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "flag"), [
    (["simulate", TINY, "--ocs-delay", "soon"], "--ocs-delay"),
    (["simulate", TINY, "--delay", "soon"], "--ocs-delay"),  # the old spelling: its value is read as the new flag's
    (["sweep", TINY, "--ocs-delays", "0,soon"], "--ocs-delays"),
    (["sweep", TINY, "--ocs-delays", ","], "--ocs-delays"),
])
def test_bad_delays_exit_2_naming_the_flag_and_write_nothing(args, flag, tmp_path):
    result = run(*args, "--out", tmp_path / "out")
    assert result.exit_code == 2 and f"error: {flag}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("gpus", ["12x", "100..10", "abc..1", "1", ",", "512..x"])
def test_cost_bad_gpu_counts_exit_2_naming_the_flag(gpus):
    result = run("cost", "--gpus", gpus)
    assert result.exit_code == 2 and "error: --gpus" in result.output and "Traceback" not in result.output


def test_cost_reads_a_comma_list_of_gpu_counts():
    rows = json.loads(run("cost", "--gpus", "1024,256", "--json").stdout)["rows"]
    assert [r["gpus"] for r in rows] == [1024, 256]
