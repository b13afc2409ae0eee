"""Workload model: parameter and FLOP counts against hand calculations and published figures,
GPU presets, the roofline time, and the Hugging Face config importer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail import workload
from lightrail.errors import ScenarioError
from lightrail.workload import GPU, GPUS, PRESETS, ModelSpec, compute_seconds, gpu, model_from_hf_config, preset

DATA = Path(__file__).parents[1] / "data"


def debug(**changes) -> ModelSpec:
    return preset("debug").with_(**changes)


# -- hand calculations on the debug model -----------------------------------------------------------
# debug: 4 layers, hidden 256, ffn 1024, 4 heads (head_dim 64), 4 KV heads, vocab 1024, seq 256, SwiGLU, untied.
ATTN = 256 * 256 + 2 * 256 * 256 + 256 * 256      # q + k,v + o = 262_144
MLP = 3 * 256 * 1024                                # gate, up, down = 786_432
NORMS = 2 * 256                                     # = 512
LAYER = ATTN + MLP + NORMS                          # = 1_049_088
EMBED = 2 * 1024 * 256                              # input + output, untied = 524_288
TOTAL = EMBED + 4 * LAYER + 256                     # + final norm = 4_720_896


def test_debug_params_by_hand():
    m = preset("debug")
    assert (m.head_dim, m.attention_dim, m.kv_dim) == (64, 256, 256)
    assert m.attention_params() == ATTN == 262_144
    assert m.mlp_params(1024) == MLP == 786_432
    assert [m.layer_params(i) for i in range(4)] == [LAYER] * 4
    assert m.layer_params(0) == 1_049_088
    assert m.embedding_params() == EMBED
    assert m.total_params() == TOTAL == 4_720_896
    assert m.active_params() == TOTAL
    assert m.expert_params(0) == 0 and m.moe_layers == 0 and not m.is_moe_layer(3)


def test_debug_flops_by_hand():
    m = preset("debug")
    tokens = 256
    # matmuls: 2 FLOPs per MAC on every weight but the norms; causal attention: 2 * tokens * seq * attention_dim
    matmul = 2 * (LAYER - NORMS) * tokens             # = 536_870_912
    attention = 2 * tokens * 256 * 256                # = 33_554_432
    assert m.layer_flops(0, tokens) == matmul + attention == 570_425_344
    assert m.logits_flops(tokens) == 2 * 1024 * 256 * tokens == 134_217_728
    assert m.forward_flops(tokens) == 4 * 570_425_344 + 134_217_728 == 2_415_919_104
    assert ModelSpec.backward_factor == 2
    assert m.training_flops(tokens) == 3 * 2_415_919_104
    assert m.layer_flops(2, 0) == 0


def test_debug_bytes_by_hand():
    m = preset("debug")
    assert m.activation_bytes(256) == 256 * 256 * 2 == 131_072
    assert m.kv_bytes(256) == 2 * 256 * 256 * 2 == 262_144
    assert m.moe_dispatch_bytes(256) == 0
    assert debug(dtype_bytes=4).activation_bytes(256) == 262_144
    assert debug(kv_heads=1).kv_bytes(256) == 2 * 256 * 64 * 2


def test_gqa_and_gelu_tied_by_hand():
    gqa = debug(kv_heads=1)
    assert gqa.kv_dim == 64
    assert gqa.attention_params() == 256 * 256 + 2 * 256 * 64 + 256 * 256 == 163_840
    gelu = debug(gated_mlp=False, tied_embeddings=True)
    assert gelu.mlp_params(1024) == 2 * 256 * 1024
    assert gelu.total_params() == 1024 * 256 + 4 * (ATTN + 2 * 256 * 1024 + NORMS) + 256 == 3_410_176


def test_moe_by_hand():
    # 4 experts of width 512, 2 per token, 1 shared, first layer dense
    m = debug(experts=4, top_k=2, moe_ffn=512, shared_experts=1, dense_layers=1)
    expert = 3 * 256 * 512                            # = 393_216
    router = 256 * 4
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
    assert m.moe_layers == 3
    assert m.layer_params(0) == LAYER
    assert m.expert_params(0) == 0
    assert m.expert_params(1) == 4 * expert == 1_572_864
    assert m.layer_params(1) == ATTN + (4 + 1) * expert + router + NORMS == 2_229_760
    assert m.layer_active_params(1) == ATTN + (2 + 1) * expert + router + NORMS == 1_443_328
    assert m.total_params() == EMBED + LAYER + 3 * 2_229_760 + 256 == 8_262_912
    assert m.active_params() == EMBED + LAYER + 3 * 1_443_328 + 256 == 5_903_616
    assert m.layer_flops(1, 10) == 2 * (1_443_328 - NORMS) * 10 + 2 * 10 * 256 * 256
    assert m.moe_dispatch_bytes(256) == 256 * 2 * 256 * 2


# -- presets against published figures --------------------------------------------------------------

# Exact: parameter counts of the Hugging Face safetensors checkpoints (meta-llama/Llama-3.1-8B, -70B, -405B;
# mistralai/Mixtral-8x7B-v0.1). Llama 3 and 3.1 share these shapes.
HF_CHECKPOINT_PARAMS = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name", sorted(HF_CHECKPOINT_PARAMS))
def test_total_params_equal_hf_checkpoints(name):
    assert preset(name).total_params() == HF_CHECKPOINT_PARAMS[name]


# Rounded figures as published: Meta model cards (8B, 70B, 405B), GPT-3 paper Table 2.1 (175.0B),
# Mixtral paper (Jiang et al. 2024: 46.7B total, 12.9B active per token). Tolerance 0.5 %: GPT-3's biases
# and learned position embeddings (~0.04B) are not modelled.
PUBLISHED = [
    ("llama3-8b", "total", 8.03e9),
    ("llama3-70b", "total", 70.6e9),
    ("llama3-405b", "total", 405.9e9),
    ("gpt3-175b", "total", 175.0e9),
    ("mixtral-8x7b", "total", 46.7e9),
    ("mixtral-8x7b", "active", 12.9e9),
]


@pytest.mark.parametrize(("name", "kind", "published"), PUBLISHED)
def test_params_near_published(name, kind, published):
    m = preset(name)
    got = m.total_params() if kind == "total" else m.active_params()
    assert got == pytest.approx(published, rel=5e-3)


def test_dense_presets_have_active_equal_total():
    for name in ("debug", "llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"):
        m = preset(name)
        assert m.experts == 0 and m.active_params() == m.total_params()


def test_deepseek_v3_with_latent_attention():
    m = preset("deepseek-v3")
    total, active = m.total_params(), m.active_params()
    assert total == 671_026_404_352 and active == 37_552_282_624
    assert m.moe_layers == 58 and not m.is_moe_layer(2) and m.is_moe_layer(3)
    # MLA (q_lora_rank 1536, kv_lora_rank 512, rope 64, nope 128, v 128, 128 heads) per layer, with its two norms:
    mla = (7168 * 1536 + 1536 + 1536 * 128 * (128 + 64) + 7168 * (512 + 64) + 512
           + 512 * 128 * (128 + 128) + 128 * 128 * 7168)
    assert mla == 187_107_328 == m.attention_params() + 1536 + 512
    # DeepSeek's 671B total and 37B active (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 1 and 4.2)
    assert total == pytest.approx(671e9, rel=5e-3)
    assert active == pytest.approx(37e9, rel=2e-2)
    # without latent attention (q, k, v of 128 heads x 128): 470M a layer, the old approximation's 688B
    plain = m.with_(q_lora_rank=0, kv_lora_rank=0, rope_head_dim=0)
    assert plain.attention_params() == 469_762_048 and plain.total_params() == 688_268_342_272
    with pytest.raises(ScenarioError, match="q_lora_rank 1536 is set without kv_lora_rank"):
        m.with_(kv_lora_rank=0)


def test_training_flops_are_six_per_active_weight_plus_attention():
    for name, m in PRESETS.items():
        tokens = m.seq_len
        matmul_weights = m.active_params() - m.vocab * m.hidden * (0 if m.tied_embeddings else 1) \
            - m.layers * (2 * m.hidden + m.q_lora_rank + m.kv_lora_rank) - m.hidden
        # forward + backward; with latent attention QK^T is head_dim + rope_head_dim wide per head
        attention = 3 * m.layers * tokens * m.seq_len * m.heads * (2 * m.head_dim + m.rope_head_dim)
        # exact: 6 FLOPs per token per matmul weight (the input embedding is a lookup) plus causal attention
        assert m.training_flops(tokens) == 6 * matmul_weights * tokens + attention, name
        # approximate: the usual 6 N per token (N counts both embeddings) plus attention, within 7 %
        approx = 6 * m.active_params() * tokens + attention
        assert m.training_flops(tokens) == pytest.approx(approx, rel=0.07), name


def test_preset_lookup():
    assert preset("LLaMA3-8B") is PRESETS["llama3-8b"]
    assert set(PRESETS) == {"debug", "llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x7b",
                            "deepseek-v3"}
    with pytest.raises(ScenarioError, match="unknown model 'gpt5'.*llama3-70b"):
        preset("gpt5")
    with pytest.raises(TypeError):
        PRESETS["mine"] = preset("debug")  # read-only


# -- construction and validation --------------------------------------------------------------------

def test_frozen_keyword_only_and_derived_defaults():
    m = preset("debug")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.layers = 8
    with pytest.raises(TypeError):
        ModelSpec("x", 1, 2, 3, 4, 4, 5, 6)  # positional
    explicit = ModelSpec(name="debug", layers=4, hidden=256, ffn=1024, heads=4, kv_heads=4, vocab=1024,
                         seq_len=256, head_dim=64)
    assert explicit == m
    mix = preset("mixtral-8x7b")
    assert mix.with_(moe_ffn=0) == mix  # 0 resolves to ffn
    assert ModelSpec(name="n", layers=np.int64(2), hidden=8, ffn=8, heads=2, kv_heads=1, vocab=4,
                     seq_len=4).layers.__class__ is int


def test_with_keeps_derived_defaults_derived():
    big = preset("llama3-8b").with_(hidden=8192, heads=64)
    assert big.head_dim == 128
    wide = debug(hidden=512)
    assert wide.head_dim == 128 and wide.attention_dim == 512
    pinned = preset("deepseek-v3").with_(hidden=4096)
    assert pinned.head_dim == 128  # given explicitly in the preset, so it stays
    dense = preset("mixtral-8x7b").with_(experts=0)
    assert (dense.experts, dense.top_k, dense.moe_ffn) == (0, 0, 0)
    assert dense.total_params() == preset("llama3-8b").with_(vocab=32000, seq_len=4096).total_params()
    assert preset("mixtral-8x7b").with_(ffn=1000).moe_ffn == 1000
    assert preset("deepseek-v3").with_(ffn=1000).moe_ffn == 2048
    with pytest.raises(ScenarioError, match="model.layer_count.*layers"):
        debug(layer_count=3)


BAD = [
    ({"layers": 0}, "model.layers"),
    ({"hidden": -1}, "model.hidden"),
    ({"vocab": 1.5}, "model.vocab"),
    ({"seq_len": True}, "model.seq_len"),
    ({"kv_heads": 3}, "model.kv_heads"),
    ({"kv_heads": 8}, "model.kv_heads"),
    ({"heads": 3}, "model.head_dim"),
    ({"top_k": 2}, "model.top_k"),
    ({"experts": 4}, "model.top_k"),
    ({"experts": 4, "top_k": 5}, "model.top_k"),
    ({"experts": 4, "top_k": 1, "dense_layers": 4}, "model.dense_layers"),
    ({"moe_ffn": 512}, "model.moe_ffn"),
    ({"shared_experts": 1}, "model.shared_experts"),
    ({"dense_layers": 1}, "model.dense_layers"),
    ({"experts": -1}, "model.experts"),
    ({"dtype_bytes": 0}, "model.dtype_bytes"),
    ({"gated_mlp": 1}, "model.gated_mlp"),
    ({"name": " "}, "model.name"),
]


@pytest.mark.parametrize(("changes", "field"), BAD)
def test_invalid_specs_name_the_field(changes, field):
    base = dict(name="debug", layers=4, hidden=256, ffn=1024, heads=4, kv_heads=4, vocab=1024, seq_len=256)
    with pytest.raises(ScenarioError) as info:
        ModelSpec(**{**base, **changes})
    assert info.value.field == field
    assert info.value.fix


def test_bad_layer_and_tokens():
    m = preset("debug")
    with pytest.raises(ScenarioError, match="layer 4 is not a layer"):
        m.layer_params(4)
    with pytest.raises(ScenarioError, match="layer"):
        m.is_moe_layer(-1)
    with pytest.raises(ScenarioError, match="tokens"):
        m.layer_flops(0, -1)
    with pytest.raises(ScenarioError, match="tokens"):
        m.kv_bytes(2.5)


# -- invariants -------------------------------------------------------------------------------------

@st.composite
def specs(draw):
    heads = draw(st.integers(1, 8))
    kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    layers = draw(st.integers(1, 6))
    experts = draw(st.integers(0, 8))
    moe = {}
    if experts:
        moe = dict(experts=experts, top_k=draw(st.integers(1, experts)), moe_ffn=draw(st.integers(0, 64)),
                   shared_experts=draw(st.integers(0, 2)), dense_layers=draw(st.integers(0, layers - 1)))
    return ModelSpec(name="h", layers=layers, hidden=heads * draw(st.integers(1, 16)), ffn=draw(st.integers(1, 64)),
                     heads=heads, kv_heads=kv_heads, vocab=draw(st.integers(1, 100)), seq_len=draw(st.integers(1, 64)),
                     gated_mlp=draw(st.booleans()), tied_embeddings=draw(st.booleans()), **moe)


@settings(max_examples=200, deadline=None)
@given(specs(), st.integers(0, 1000), st.integers(0, 1000))
def test_invariants(m, a, b):
    assert m.total_params() >= m.active_params() > 0
    assert m.total_params() == m.embedding_params() + sum(m.layer_params(i) for i in range(m.layers)) + m.hidden
    assert m.active_params() == m.embedding_params() + sum(m.layer_active_params(i) for i in range(m.layers)) \
        + m.hidden
    assert m.moe_layers == sum(m.is_moe_layer(i) for i in range(m.layers))
    for i in range(m.layers):
        assert m.layer_flops(i, a + b) == m.layer_flops(i, a) + m.layer_flops(i, b)  # linear in tokens
        assert m.layer_params(i) - m.layer_active_params(i) == \
            (m.experts - m.top_k) * m.mlp_params(m.moe_ffn) * m.is_moe_layer(i)
    assert m.forward_flops(a + b) == m.forward_flops(a) + m.forward_flops(b)
    assert m.training_flops(a) == 3 * m.forward_flops(a)
    for fn in (m.activation_bytes, m.moe_dispatch_bytes, m.kv_bytes, m.logits_flops):
        assert fn(a + b) == fn(a) + fn(b)


@settings(max_examples=100, deadline=None)
@given(specs())
def test_all_experts_active_means_active_equals_total(m):
    if m.experts:
        every = m.with_(top_k=m.experts)
        assert every.active_params() == every.total_params()
        assert m.active_params() <= every.active_params()
        if m.top_k < m.experts:
            assert m.active_params() < m.total_params()


# -- hardware ---------------------------------------------------------------------------------------

def test_gpu_presets():
    h100 = gpu("H100")
    assert h100 is GPUS["h100"] and h100.peak_flops == 989.4e12
    assert h100.nvlink_bandwidth == 450e9 and h100.nic_bandwidth == 50e9 and h100.memory_bytes == 80e9
    assert gpu("h200") is gpu("H200") is gpu("h200-sxm") is gpu("H200 SXM")
    assert gpu("h200").peak_flops == h100.peak_flops and gpu("h200").memory_bytes == 141e9
    b200 = gpu("b200")
    assert (b200.peak_flops, b200.memory_bytes, b200.nvlink_bandwidth, b200.nic_bandwidth) == \
        (2.25e15, 180e9, 900e9, 50e9)
    a100 = gpu("A100 SXM 80GB")
    assert (a100.peak_flops, a100.nvlink_bandwidth, a100.nic_bandwidth) == (312e12, 300e9, 25e9)
    with pytest.raises(ScenarioError, match="unknown GPU 'V100'.*H100, H200, B200, A100"):
        gpu("V100")


def test_gpu_validation():
    with pytest.raises(ScenarioError) as info:
        GPU(name="x", peak_flops=1e12, memory_bytes=0, nvlink_bandwidth=1.0, nic_bandwidth=1.0)
    assert info.value.field == "gpu.memory_bytes"
    with pytest.raises(ScenarioError):
        GPU(name="x", peak_flops=float("nan"), memory_bytes=1, nvlink_bandwidth=1.0, nic_bandwidth=1.0)


def test_compute_seconds():
    h100 = gpu("h100")
    assert compute_seconds(989.4e12, h100, 1.0) == pytest.approx(1.0)
    assert compute_seconds(989.4e12, h100, 0.5) == pytest.approx(2.0)
    assert compute_seconds(0, h100, 0.4) == 0.0
    # one Llama-3-8B training step on one 8192-token sequence at 40 % MFU: ~0.42 PFLOP -> ~1.07 s
    m = preset("llama3-8b")
    assert compute_seconds(m.training_flops(8192), h100, 0.4) == pytest.approx(
        m.training_flops(8192) / (0.4 * 989.4e12))
    for mfu in (0, -0.1, 1.01, float("nan"), True):
        with pytest.raises(ScenarioError) as info:
            compute_seconds(1e12, h100, mfu)
        assert info.value.field == "job.mfu"
    with pytest.raises(ScenarioError, match="flops"):
        compute_seconds(-1.0, h100, 0.5)


# -- Hugging Face importer --------------------------------------------------------------------------

def test_import_llama_fixture_equals_preset():
    assert model_from_hf_config(DATA / "llama3-8b.config.json", name="llama3-8b") == preset("llama3-8b")


def test_import_mixtral_fixture_equals_preset():
    got = model_from_hf_config(str(DATA / "mixtral-8x7b.config.json"), name="mixtral-8x7b", seq_len=4096)
    assert got == preset("mixtral-8x7b")
    assert model_from_hf_config(DATA / "mixtral-8x7b.config.json").seq_len == 32768  # max_position_embeddings


def test_import_names_and_forms(tmp_path):
    config = json.loads((DATA / "llama3-8b.config.json").read_text())
    assert model_from_hf_config(config).name == "llama"  # model_type, when nothing better is known
    assert model_from_hf_config({**config, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}).name == \
        "meta-llama/Meta-Llama-3-8B"
    assert model_from_hf_config(DATA / "llama3-8b.config.json").name == "llama3-8b.config"
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    from_dir = model_from_hf_config(folder, seq_len=2048)
    assert from_dir.name == "my-llama" and from_dir.seq_len == 2048
    assert model_from_hf_config(json.dumps(config), name="t").with_(name="llama3-8b") == preset("llama3-8b")


def test_import_gpt2_style():
    # GPT-2 small config keys (openai-community/gpt2): n_inner null means 4 * n_embd; no tie flag means tied
    gpt2 = {"model_type": "gpt2", "activation_function": "gelu_new", "n_layer": 12, "n_embd": 768, "n_head": 12,
            "n_inner": None, "n_positions": 1024, "vocab_size": 50257}
    m = model_from_hf_config(gpt2, name="gpt2")
    assert (m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, m.seq_len) == (12, 768, 3072, 12, 12, 1024)
    assert not m.gated_mlp and m.tied_embeddings
    # 124.4M published for GPT-2 small, of which biases, LayerNorm biases and 1024 x 768 positions are not modelled
    assert m.total_params() == 50257 * 768 + 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 2 * 768) + 768
    assert m.total_params() == pytest.approx(124.44e6, rel=0.01)


def test_import_deepseek_and_qwen_moe():
    deepseek = {"model_type": "deepseek_v3", "hidden_act": "silu", "num_hidden_layers": 61, "hidden_size": 7168,
                "intermediate_size": 18432, "num_attention_heads": 128, "num_key_value_heads": 128,
                "vocab_size": 129280, "max_position_embeddings": 163840, "n_routed_experts": 256,
                "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
                "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False}
    assert model_from_hf_config(deepseek, name="deepseek-v3", seq_len=4096) == preset("deepseek-v3")
    with pytest.raises(ScenarioError, match="moe_layer_freq"):
        model_from_hf_config({**deepseek, "moe_layer_freq": 2})
    qwen = {"model_type": "qwen2_moe", "hidden_act": "silu", "num_hidden_layers": 24, "hidden_size": 2048,
            "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
            "max_position_embeddings": 8192, "num_experts": 60, "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "tie_word_embeddings": False}
    m = model_from_hf_config(qwen)
    assert (m.experts, m.top_k, m.moe_ffn, m.shared_experts, m.dense_layers) == (60, 4, 1408, 4, 0)
    with pytest.raises(ScenarioError, match="mlp_only_layers"):
        model_from_hf_config({**qwen, "mlp_only_layers": [0]})


def test_import_gated_by_architecture():
    gemma = {"model_type": "gemma", "hidden_act": "gelu_pytorch_tanh", "num_hidden_layers": 2, "hidden_size": 64,
             "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 8}
    assert model_from_hf_config(gemma).gated_mlp  # GeGLU despite the gelu name
    assert not model_from_hf_config({**gemma, "model_type": "gpt_neox", "hidden_act": "gelu"}).gated_mlp
    assert model_from_hf_config({**gemma, "model_type": "unknown", "hidden_act": "silu"}).gated_mlp


def test_import_errors(tmp_path):
    config = json.loads((DATA / "llama3-8b.config.json").read_text())
    with pytest.raises(ScenarioError) as info:
        model_from_hf_config({k: v for k, v in config.items() if k != "hidden_size"})
    assert info.value.field == "config.json: hidden_size"
    assert str(info.value).startswith("config.json: hidden_size: missing required field")
    with pytest.raises(ScenarioError, match="config.json: num_hidden_layers: '32' is not an integer"):
        model_from_hf_config({**config, "num_hidden_layers": "32"})
    with pytest.raises(ScenarioError, match="max_position_embeddings"):
        model_from_hf_config({k: v for k, v in config.items() if k != "max_position_embeddings"})
    with pytest.raises(ScenarioError, match="num_experts_per_tok"):
        model_from_hf_config({**config, "num_local_experts": 8})
    bad = tmp_path / "config.json"
    bad.write_text("hidden_size: 4096\n")
    with pytest.raises(ScenarioError, match="not JSON") as info:
        model_from_hf_config(bad)
    assert info.value.field == str(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ScenarioError, match="not an object"):
        model_from_hf_config(bad)
    with pytest.raises(ScenarioError, match="no such file"):
        model_from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ScenarioError, match="model.seq_len"):
        model_from_hf_config(config, seq_len=0)


def test_package_exports():
    assert set(workload.__all__) == {"ModelSpec", "PRESETS", "preset", "GPU", "GPUS", "gpu", "compute_seconds",
                                     "model_from_hf_config"}
    for name in workload.__all__:
        assert getattr(workload, name) is not None
