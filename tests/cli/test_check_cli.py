"""``lightrail check``: scenario and sweep files told apart, ``--json`` for scripts, a bare 0 a zero duration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.scenario import parse_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATA = Path(__file__).resolve().parents[1] / "data"
runner = CliRunner()
TINY = {"name": "tiny", "model": "debug", "cluster": {"gpus": 8, "gpus_per_server": 4, "gpu": "h100"},
        "parallel": {"tp": 2, "dp": 4}, "job": {"micro_batches": 2}}


def check(*args):
    return runner.invoke(app, ["check", *map(str, args)])


def test_check_json_gives_parameters_and_tokens_for_a_scenario():
    result = check(EXAMPLES / "debug-tiny.yaml", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["kind"] == "scenario"
    assert data["parameters"] == 8_917_248 and data["tokens_per_iteration"] == 3072


def test_check_recognises_a_sweep_file_and_counts_its_cells():
    result = check(EXAMPLES / "sweeps" / "debug.yaml", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["kind"] == "sweep" and data["cells"] == 18
    assert data["fields"] == ["ocs.reconfig_delay", "job.micro_batches", "ocs.mode"]
    text = check(EXAMPLES / "sweeps" / "debug.yaml")
    assert text.exit_code == 0 and "18 cells" in text.stdout


def test_check_names_a_bad_sweep_cell(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"scenario": TINY, "grid": {"parallel.tp": [2, 3]}}))
    result = check(sweep, "--json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False and "cell 1 (parallel.tp=3)" in data["error"]


def test_check_reads_deepseeks_own_config(tmp_path):
    (tmp_path / "config_671B.json").write_text((DATA / "deepseek-v3.config_671B.json").read_text())
    scenario = {**TINY, "model": {"hf_config": "config_671B.json", "seq_len": 4096},
                "cluster": {"gpus": 512, "gpu": "h200"}, "parallel": {"tp": 8, "ep": 8, "dp": 8}}
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = check(path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["parameters"] == pytest.approx(671e9, rel=0.01)


@pytest.mark.parametrize("field", ["cluster.alpha", "cluster.latency", "ocs.reconfig_delay", "ocs.check_in_rtt",
                                   "ocs.command_latency", "ocs.revoke_rtt", "ocs.switch_grant_latency"])
def test_a_bare_zero_is_a_zero_duration_in_scenario_files(field):
    section, key = field.split(".")
    built = parse_scenario({**TINY, section: {**TINY.get(section, {}), key: 0}}).build()
    attr = {"reconfig_delay": "ocs_delay"}.get(key, key)
    assert getattr(built.fabric, attr) == 0.0
    with pytest.raises(ScenarioError, match="'5' has no unit") as info:
        parse_scenario({**TINY, section: {**TINY.get(section, {}), key: 5}}).build()
    assert info.value.field == field


def test_the_switch_grant_latency_a_scenario_sets_reaches_the_fabric_and_delays_each_switch():
    """``ocs.switch_grant_latency`` (train-demo measures it; issue 29) lengthens the photonic iteration on demand, where
    every switch is waited for."""
    from lightrail.sim.iteration import simulate_iteration
    from lightrail.workload.program import build_program

    def run(lag: str):
        built = parse_scenario({"name": "t", "model": {"preset": "debug", "overrides": {"layers": 4}},
                                "cluster": {"gpus": 4, "gpus_per_server": 1, "gpu": "h100"},
                                "parallel": {"pp": 2, "dp": 2}, "job": {"micro_batches": 2},
                                "ocs": {"reconfig_delay": "1ms", "mode": "on-demand",
                                        "switch_grant_latency": lag}}).build()
        return built.fabric, simulate_iteration(build_program(built.job), built.fabric, built.policy)

    (f0, base), (f3, slow) = run("0"), run("3ms")
    assert f3.switch_grant_latency == pytest.approx(3e-3) and f0.switch_grant_latency == 0.0
    assert base.reconfigurations_per_iteration > 0
    assert slow.iteration_time_s >= base.iteration_time_s + 3e-3  # at least one switch was waited for
