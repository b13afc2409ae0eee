"""The importer reads real configs as their authors publish them, names what it cannot read, and counts what
their papers count (files and their provenance: tests/data/MODEL_CONFIGS.md; nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrail.errors import ScenarioError
from lightrail.workload import model_from_hf_config, preset

DATA = Path(__file__).resolve().parents[1] / "data"

# (file, total parameters as published, active per token or None, where the figure is published). Tolerance 2 %:
# biases (Qwen2's q/k/v), DeepSeek's router bias and rounding in the published figures are below it.
PUBLISHED = [
    ("llama3-8b.config.json", 8.03e9, None, "Meta Llama 3 model card (8B), huggingface.co/meta-llama/Meta-Llama-3-8B"),
    ("llama3.1-70b.config.json", 70.6e9, None, "Llama 3.1 model card (70B); Llama 3 70B has the same shapes"),
    ("llama3.1-405b.config.json", 405e9, None, "Llama 3 Herd of Models, arXiv:2407.21783, Table 3 (405B)"),
    ("mixtral-8x7b.config.json", 46.7e9, 12.9e9, "Mixtral of Experts, arXiv:2401.04088, Sec. 2 (47B, 13B active)"),
    ("mixtral-8x22b.config.json", 141e9, 39e9, "mistral.ai/news/mixtral-8x22b (141B, 39B active)"),
    ("qwen2-72b.config.json", 72.71e9, None, "Qwen2 Technical Report, arXiv:2407.10671, Table 1 (72B); HF page 72.7B"),
    ("deepseek-v3.config.json", 671e9, 37e9, "DeepSeek-V3 Technical Report, arXiv:2412.19437, Sec. 1 (671B, 37B)"),
    ("deepseek-v3.config_671B.json", 671e9, 37e9, "the same model in DeepSeek's own inference format"),
]


@pytest.mark.parametrize(("file", "total", "active", "source"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_published_sizes(file, total, active, source):
    m = model_from_hf_config(DATA / file)
    assert m.total_params() == pytest.approx(total, rel=0.02), source
    if active is not None:
        assert m.active_params() == pytest.approx(active, rel=0.02), source


def test_deepseek_inference_format_reads_as_the_hf_config_and_the_preset():
    native = model_from_hf_config(DATA / "deepseek-v3.config_671B.json", name="deepseek-v3", seq_len=4096)
    hf = model_from_hf_config(DATA / "deepseek-v3.config.json", name="deepseek-v3", seq_len=4096)
    assert native == hf == preset("deepseek-v3")
    assert (native.moe_ffn, native.dense_layers, native.shared_experts, native.kv_lora_rank) == (2048, 3, 1, 512)
    assert model_from_hf_config(DATA / "deepseek-v3.config_671B.json").seq_len == 16384  # ModelArgs' default


def test_deepseek_format_names_every_missing_key_at_once():
    data = json.loads((DATA / "deepseek-v3.config_671B.json").read_text())
    for key in ("moe_inter_dim", "n_dense_layers", "q_lora_rank"):
        del data[key]
    with pytest.raises(ScenarioError) as info:
        model_from_hf_config(data)
    assert info.value.field == "config.json: moe_inter_dim, n_dense_layers, q_lora_rank"
    assert "missing required fields (3)" in str(info.value) and "DeepSeek inference config" in str(info.value)
    assert "closest preset: deepseek-v3" in str(info.value)


def test_hand_renamed_deepseek_config_counts_its_moe_keys():
    # The case: DeepSeek's keys renamed by hand to HF names, moe_inter_dim and n_dense_layers left as they
    # were. They were ignored (4.17T parameters); they are read now.
    data = json.loads((DATA / "deepseek-v3.config_671B.json").read_text())
    renames = {"dim": "hidden_size", "inter_dim": "intermediate_size", "n_layers": "num_hidden_layers",
               "n_heads": "num_attention_heads", "n_activated_experts": "num_experts_per_tok"}
    hf = {renames.get(k, k): v for k, v in data.items()} | {"max_position_embeddings": 4096}
    assert model_from_hf_config(hf).total_params() == preset("deepseek-v3").total_params()


def test_hf_config_names_every_missing_key_at_once():
    config = json.loads((DATA / "llama3.1-70b.config.json").read_text())
    for key in ("hidden_size", "vocab_size", "intermediate_size"):
        del config[key]
    with pytest.raises(ScenarioError) as info:
        model_from_hf_config(config)
    assert info.value.field == "config.json: hidden_size, vocab_size, intermediate_size"
    assert "closest preset: llama3-70b" in str(info.value)


def test_a_file_that_is_no_model_config_is_named_as_such(tmp_path):
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"d_model": 4096, "layers_total": 32, "vocab": 128256, "lr": 3e-4}))
    with pytest.raises(ScenarioError) as info:
        model_from_hf_config(other)
    text = str(info.value)
    assert info.value.field == str(other)
    assert "not a Hugging Face config.json" in text and "DeepSeek" in text and "d_model" in text
    assert "closest: llama3-8b" in text
    with pytest.raises(ScenarioError, match="text_config"):
        model_from_hf_config({"text_config": {"hidden_size": 8}, "vision_config": {}})


def test_moe_keys_that_change_the_size_are_read_or_refused():
    config = json.loads((DATA / "mixtral-8x7b.config.json").read_text())
    with pytest.raises(ScenarioError, match="MoE keys not modelled: moe_num_shared_experts, residual_moe"):
        model_from_hf_config({**config, "moe_num_shared_experts": 2, "residual_moe": True})
    assert model_from_hf_config({**config, "router_jitter_noise": 0.1}) == model_from_hf_config(config)  # routing
    dense = json.loads((DATA / "llama3-8b.config.json").read_text())
    with pytest.raises(ScenarioError, match="moe_intermediate_size is set but the config has no experts"):
        model_from_hf_config({**dense, "moe_intermediate_size": 2048})
    deepseek = json.loads((DATA / "deepseek-v3.config.json").read_text())
    with pytest.raises(ScenarioError, match="qk_nope_head_dim 192 differs from v_head_dim 128"):
        model_from_hf_config({**deepseek, "qk_nope_head_dim": 192})
