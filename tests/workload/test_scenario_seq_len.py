"""The training sequence length is a scenario field, never silently a HuggingFace config's maximum context."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.scenario import DEFAULT_SCENARIO, parse_scenario

CONFIG = str(Path(__file__).resolve().parents[1] / "data" / "mixtral-8x7b.config.json")  # max context 32768
BASE = {**DEFAULT_SCENARIO, "cluster": {"gpus": 64, "gpu": "h100"}, "parallel": {"tp": 8, "pp": 4, "dp": 2},
        "job": {"micro_batches": 8, "micro_batch_size": 2}}


def test_an_hf_config_needs_the_sequence_length():
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**BASE, "model": {"hf_config": CONFIG}}).build()
    assert info.value.field == "model.seq_len"
    built = parse_scenario({**BASE, "model": {"hf_config": CONFIG, "seq_len": 4096}}).build()
    assert built.model.seq_len == 4096
    # the older spelling through overrides still counts as giving it
    assert parse_scenario({**BASE, "model": {"hf_config": CONFIG, "overrides": {"seq_len": 2048}}}).build() \
        .model.seq_len == 2048


def test_seq_len_overrides_a_preset_and_feeds_the_job():
    short = parse_scenario({**BASE, "model": {"preset": "llama3-8b", "seq_len": 2048}}).build()
    long = parse_scenario({**BASE, "model": {"preset": "llama3-8b"}}).build()
    assert (short.model.seq_len, long.model.seq_len) == (2048, 8192)
    # tokens per iteration: micro_batches x micro_batch_size x dp x seq_len
    assert short.job.tokens_per_iteration == 8 * 2 * 2 * 2048
    assert long.job.tokens_per_iteration == 4 * short.job.tokens_per_iteration


def test_check_prints_what_the_simulation_uses(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model": {"hf_config": CONFIG, "seq_len": 4096}}))
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exit_code == 0, result.output
    built = parse_scenario({**BASE, "model": {"hf_config": CONFIG, "seq_len": 4096}}).build()
    text = " ".join(result.output.split())
    assert "sequence length 4096 tokens" in text
    assert f"{8 * 2 * 2 * 4096:,} tokens per iteration" in text
    assert f"{built.model.total_params():,} parameters" in text
    path.write_text(yaml.safe_dump({**BASE, "model": {"hf_config": CONFIG}}))
    bad = CliRunner().invoke(app, ["check", str(path)])
    assert bad.exit_code == 2 and "model.seq_len" in bad.output
