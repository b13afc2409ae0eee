"""Transformer and MoE model sizes: parameters, FLOPs and the bytes each parallelism dimension moves.

A :class:`ModelSpec` is the part of a training job that the fabric sees: how much compute a layer
costs (which sets the gaps between communication phases) and how many bytes cross a pipeline-stage
boundary, an expert dispatch or a context-parallel ring step (which sets the size of each phase).
Everything is exact integer arithmetic so that totals can be compared with published figures
digit for digit; biases, position embeddings and element-wise operations are left out because
they are below 0.5 % of any preset here (see the notes on each preset).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from lightrail.errors import ScenarioError
from lightrail.limits import check_count

__all__ = ["ModelSpec", "MODEL_BOUNDS", "PRESETS", "preset"]

_POSITIVE = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq_len", "dtype_bytes")
_NON_NEGATIVE = ("head_dim", "experts", "top_k", "moe_ffn", "shared_experts", "dense_layers", "q_lora_rank",
                 "kv_lora_rank", "rope_head_dim")


_WIDE = 1 << 20
MODEL_BOUNDS = {"layers": 16_384, "hidden": _WIDE, "ffn": _WIDE, "moe_ffn": _WIDE, "head_dim": _WIDE,
                "kv_lora_rank": _WIDE, "q_lora_rank": _WIDE, "rope_head_dim": _WIDE, "vocab": 1 << 24,
                "seq_len": 1 << 24, "heads": 1 << 16, "kv_heads": 1 << 16, "experts": 1 << 16, "top_k": 1 << 16,
                "shared_experts": 1 << 16, "dense_layers": 16_384, "dtype_bytes": 16}
"""Largest value of each size field: what one simulation can hold. The iteration is built and simulated layer by
layer (~40 us per layer: 1,000,000 layers take 42 s, 10^9 hours), so ``layers`` is bounded at 128x the deepest
preset (Llama-3 405B, 126). Widths are bounded at 64x the widest preset (hidden 16,384), vocab and seq_len at 2^24,
heads and experts at 2^16 (DeepSeek-V3 has 256 experts): every count stays exact (parameters at most ~10^18, below
2^63) and readable, where an unbounded integer printed a 4,000-digit parameter count."""


def _count(value: object, field: str, *, minimum: int) -> int:
    """A Python int >= minimum (numpy ints are converted so products of sizes cannot overflow)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ScenarioError(f"{value!r} is not an integer", field=field, fix="give a whole number")
    if value < minimum:
        raise ScenarioError(f"{value} is below {minimum}", field=field, fix=f"use an integer >= {minimum}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts, as the fabric sees it.

    ``head_dim=0`` and (in an MoE model) ``moe_ffn=0`` are resolved in ``__post_init__`` to
    ``hidden // heads`` and ``ffn``, so a spec built from defaults equals one built from the values.
    """

    name: str
    layers: int
    """Transformer blocks."""
    hidden: int
    """Model (residual stream) width."""
    ffn: int
    """Intermediate size of a dense MLP."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention); ``heads`` for multi-head attention."""
    vocab: int
    seq_len: int
    """Training sequence length, the span causal attention covers."""
    head_dim: int = 0
    """Width of one head; 0 means ``hidden // heads``."""
    experts: int = 0
    """Routed experts per MoE layer; 0 makes the model dense."""
    top_k: int = 0
    """Routed experts each token visits (0 iff dense)."""
    moe_ffn: int = 0
    """Intermediate size of one routed or shared expert; 0 means ``ffn``."""
    shared_experts: int = 0
    """Experts every token visits in an MoE layer (DeepSeek's ``n_shared_experts``)."""
    dense_layers: int = 0
    """Leading layers of an MoE model that keep a dense MLP (DeepSeek's ``first_k_dense_replace``)."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3): width of the compressed key-value latent; 0 for ordinary
    (grouped-query) attention. With it, ``head_dim`` is the width of a value head and of a query/key head's
    non-rotary part (DeepSeek's ``v_head_dim`` = ``qk_nope_head_dim``)."""
    q_lora_rank: int = 0
    """MLA: rank of the low-rank query projection; 0 for a full-rank query projection (DeepSeek-V2-Lite)."""
    rope_head_dim: int = 0
    """MLA: width of the decoupled rotary part of each query and key head (``qk_rope_head_dim``)."""
    gated_mlp: bool = True
    """SwiGLU/GeGLU (gate, up and down: 3 matrices) if True; GELU MLP (up, down: 2) if False."""
    tied_embeddings: bool = False
    """Output projection shares the input embedding matrix."""
    dtype_bytes: int = 2
    """Bytes per activation element on the wire (2 = bf16)."""

    backward_factor: ClassVar[int] = 2
    """Backward FLOPs / forward FLOPs: each matmul needs one product for the input gradient and one for
    the weight gradient (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1)."""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ScenarioError(f"{self.name!r} is not a name", field="model.name", fix="give a non-empty string")
        for key in _POSITIVE + _NON_NEGATIVE:
            value = _count(getattr(self, key), f"model.{key}", minimum=1 if key in _POSITIVE else 0)
            check_count(value, field=f"model.{key}", lo=value, hi=MODEL_BOUNDS[key], what=key,
                        fix="one simulation holds no more (docs/limits.md)")
            object.__setattr__(self, key, value)
        for key in ("gated_mlp", "tied_embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise ScenarioError(f"{getattr(self, key)!r} is not a boolean", field=f"model.{key}",
                                    fix="use true or false")
        self._check_attention()
        self._check_moe()

    def _check_attention(self) -> None:
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ScenarioError(f"hidden {self.hidden} is not divisible by heads {self.heads}",
                                    field="model.head_dim", fix="give head_dim explicitly or change heads")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ScenarioError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}",
                                field="model.kv_heads", fix="use a divisor of heads (heads for multi-head attention)")
        if not self.kv_lora_rank:
            for key in ("q_lora_rank", "rope_head_dim"):
                if getattr(self, key):
                    raise ScenarioError(f"{key} {getattr(self, key)} is set without kv_lora_rank",
                                        field=f"model.{key}", fix="set kv_lora_rank for latent attention, or 0")

    def _check_moe(self) -> None:
        if self.experts == 0:
            if self.top_k:
                raise ScenarioError(f"top_k {self.top_k} without experts", field="model.top_k",
                                    fix="set experts > 0 for an MoE model, or top_k 0 for a dense one")
            for key in ("moe_ffn", "shared_experts", "dense_layers"):
                if getattr(self, key):
                    raise ScenarioError(f"{key} {getattr(self, key)} is set but the model is dense (experts 0)",
                                        field=f"model.{key}", fix="set experts and top_k, or leave it 0")
            return
        if not 1 <= self.top_k <= self.experts:
            raise ScenarioError(f"top_k {self.top_k} is outside 1..experts ({self.experts})", field="model.top_k",
                                fix="route each token to between 1 and experts experts")
        if self.dense_layers >= self.layers:
            raise ScenarioError(f"dense_layers {self.dense_layers} leaves no MoE layer of {self.layers}",
                                field="model.dense_layers", fix=f"use 0..{self.layers - 1}, or experts 0")
        if self.moe_ffn == 0:
            object.__setattr__(self, "moe_ffn", self.ffn)

    def with_(self, **changes) -> ModelSpec:
        """A copy with ``changes`` applied (``dataclasses.replace``), validated again.

        ``head_dim`` and ``moe_ffn`` that equal their derived default follow their inputs
        (``hidden``/``heads``, ``ffn``) unless given, and making a model dense (``experts=0``) clears
        its MoE fields unless given, so ``preset("llama3-8b").with_(hidden=8192, heads=64)`` keeps
        128-wide heads and ``preset("mixtral-8x7b").with_(experts=0)`` is a dense Mistral.
        """
        names = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in names:
                raise ScenarioError(f"unknown field {key!r}", field=f"model.{key}",
                                    fix=f"use one of: {', '.join(sorted(names))}")
        if "head_dim" not in changes and {"hidden", "heads"} & changes.keys() \
                and self.head_dim * self.heads == self.hidden:
            changes["head_dim"] = 0
        if changes.get("experts", self.experts) == 0:
            for key in ("top_k", "moe_ffn", "shared_experts", "dense_layers"):
                changes.setdefault(key, 0)
        elif "moe_ffn" not in changes and "ffn" in changes and self.moe_ffn == self.ffn:
            changes["moe_ffn"] = 0
        return dataclasses.replace(self, **changes)

    # -- shapes ----------------------------------------------------------------------------------

    @property
    def attention_dim(self) -> int:
        """Width of all query heads together (``heads * head_dim``)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together (``kv_heads * head_dim``)."""
        return self.kv_heads * self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts."""
        return self.layers - self.dense_layers if self.experts else 0

    def _layer(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < self.layers:
            raise ScenarioError(f"layer {i!r} is not a layer of {self.name} ({self.layers} layers)",
                                field="layer", fix=f"use 0 <= layer < {self.layers}")
        return int(i)

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) has routed experts: the leading ``dense_layers`` do not."""
        i = self._layer(i)
        return self.experts > 0 and i >= self.dense_layers

    # -- parameters --------------------------------------------------------------------------------

    def attention_params(self) -> int:
        """Q, K, V and output projections (no biases); with latent attention, its down- and up-projections
        (DeepSeek-V3: q 7168x1536, 1536x128x192; kv 7168x576, 512x128x256; out 128x128x7168: 187.1M a layer)."""
        out = self.attention_dim * self.hidden
        if not self.kv_lora_rank:
            return self.hidden * self.attention_dim + 2 * self.hidden * self.kv_dim + out
        q_width = self.heads * (self.head_dim + self.rope_head_dim)
        q = self.hidden * self.q_lora_rank + self.q_lora_rank * q_width if self.q_lora_rank else self.hidden * q_width
        kv = self.hidden * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank * 2 * self.attention_dim
        return q + kv + out

    def mlp_params(self, width: int) -> int:
        """One MLP (dense block or one expert) of intermediate size ``width``."""
        return (3 if self.gated_mlp else 2) * self.hidden * _count(width, "width", minimum=0)

    def expert_params(self, i: int) -> int:
        """All routed experts of layer ``i`` (what expert parallelism splits); 0 for a dense layer."""
        return self.experts * self.mlp_params(self.moe_ffn) if self.is_moe_layer(i) else 0

    def _norm_params(self) -> int:
        # One weight vector before attention and one before the MLP (RMSNorm; a LayerNorm bias is not counted),
        # and MLA's norms of its query and key-value latents.
        return 2 * self.hidden + self.q_lora_rank + self.kv_lora_rank

    def _layer_params(self, i: int, routed: int) -> int:
        if not self.is_moe_layer(i):
            return self.attention_params() + self.mlp_params(self.ffn) + self._norm_params()
        return (self.attention_params() + (routed + self.shared_experts) * self.mlp_params(self.moe_ffn)
                + self.hidden * self.experts + self._norm_params())

    def layer_params(self, i: int) -> int:
        """Weights stored by layer ``i``: attention, MLP or all experts plus router, and two norms."""
        return self._layer_params(i, self.experts)

    def layer_active_params(self, i: int) -> int:
        """Weights one token of layer ``i`` multiplies: as ``layer_params`` with ``top_k`` routed experts."""
        return self._layer_params(i, self.top_k)

    def embedding_params(self) -> int:
        """Input embedding plus output projection (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def _sum_layers(self, per_layer) -> int:
        # Layers of one kind are identical, so one of each kind stands for all of them.
        first_moe = self.dense_layers if self.experts else None
        dense = self.layers - self.moe_layers
        total = dense * per_layer(0) if dense else 0
        return total + (self.moe_layers * per_layer(first_moe) if first_moe is not None else 0)

    def total_params(self) -> int:
        """Every weight: embeddings, all layers and the final norm."""
        return self.embedding_params() + self._sum_layers(self.layer_params) + self.hidden

    def active_params(self) -> int:
        """Weights one token touches (embeddings included, as Mixtral's 12.9B and DeepSeek's 37B count them)."""
        return self.embedding_params() + self._sum_layers(self.layer_active_params) + self.hidden

    # -- FLOPs -------------------------------------------------------------------------------------

    def layer_flops(self, i: int, tokens: int) -> int:
        """Forward FLOPs of layer ``i`` for ``tokens`` tokens drawn from sequences of ``seq_len``.

        Matmuls cost 2 FLOPs per multiply-accumulate on every active weight except the norms
        (element-wise, not a matmul); causal attention adds ``QK^T`` and ``AV``, each
        ``seq_len * attention_dim`` MACs per token, halved by the mask: ``2 * tokens * seq_len *
        attention_dim`` (with latent attention ``QK^T`` is ``head_dim + rope_head_dim`` wide per head). Softmax,
        activations and residual adds are left out. The backward pass
        costs ``backward_factor`` times this; activation recomputation, if used, adds one more forward.
        """
        t = _count(tokens, "tokens", minimum=0)
        matmul_params = self.layer_active_params(i) - self._norm_params()
        return 2 * matmul_params * t + t * self.seq_len * self.heads * (2 * self.head_dim + self.rope_head_dim)

    def logits_flops(self, tokens: int) -> int:
        """Forward FLOPs of the output projection (the input embedding is a lookup, free)."""
        return 2 * self.vocab * self.hidden * _count(tokens, "tokens", minimum=0)

    def forward_flops(self, tokens: int) -> int:
        """Forward FLOPs of the whole model for ``tokens`` tokens."""
        return self._sum_layers(lambda i: self.layer_flops(i, tokens)) + self.logits_flops(tokens)

    def training_flops(self, tokens: int) -> int:
        """Forward plus backward FLOPs: ``(1 + backward_factor) * forward``, about 6 per active weight per token."""
        return (1 + self.backward_factor) * self.forward_flops(tokens)

    # -- bytes on the wire -------------------------------------------------------------------------

    def activation_bytes(self, tokens: int) -> int:
        """The residual stream of ``tokens`` tokens: what crosses a pipeline-stage boundary (each way)."""
        return _count(tokens, "tokens", minimum=0) * self.hidden * self.dtype_bytes

    def moe_dispatch_bytes(self, tokens: int) -> int:
        """Tokens sent to their ``top_k`` experts in one MoE layer, per direction (dispatch or combine)."""
        return _count(tokens, "tokens", minimum=0) * self.top_k * self.hidden * self.dtype_bytes

    def moe_alltoall_bytes(self, tokens: int, ep: int, *, dispatch: str = "payload", capacity_factor: float = 1.0,
                           imbalance: float = 1.0) -> float:
        """One rank's EP all-to-all buffer for ``tokens`` tokens in one MoE layer, per direction, from the MoE
        layer's own traffic formulas (:func:`lightrail.workload.moe_bytes.alltoall_buffer_bytes`).

        ``payload`` (routed tokens only; with ``imbalance`` 1 this is :meth:`moe_dispatch_bytes`) or
        ``padded`` (``experts x capacity`` slots, ``capacity = ceil(capacity_factor * tokens * top_k /
        experts)``). The buffer holds the rank's own chunk too; the ``(ep - 1) / ep`` that goes to other ranks
        is what crosses the wire (:func:`~lightrail.workload.moe_bytes.payload_bytes`, ``padded_bytes``)."""
        from lightrail.workload.moe_bytes import alltoall_buffer_bytes

        tokens = _count(tokens, "tokens", minimum=0)
        if not self.experts:
            return 0
        return alltoall_buffer_bytes(dispatch, tokens, self.top_k, self.hidden, self.dtype_bytes, ep, self.experts,
                                     capacity_factor=capacity_factor, imbalance=imbalance)

    def kv_bytes(self, tokens: int) -> int:
        """K and V of ``tokens`` tokens in one layer: what a context-parallel ring passes per step."""
        return 2 * _count(tokens, "tokens", minimum=0) * self.kv_dim * self.dtype_bytes


def _presets() -> Mapping[str, ModelSpec]:
    specs = [
        ModelSpec(name="debug", layers=4, hidden=256, ffn=1024, heads=4, kv_heads=4, vocab=1024, seq_len=256),
        # Llama 3: config.json of meta-llama/Meta-Llama-3-8B, -70B and Meta-Llama-3.1-405B on Hugging Face
        # (SwiGLU, untied, GQA with 8 KV heads, head_dim 128). seq_len 8192 is the pre-training context
        # (Llama 3.1 configs report 131072 after long-context extension).
        ModelSpec(name="llama3-8b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
                  seq_len=8192),
        ModelSpec(name="llama3-70b", layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256,
                  seq_len=8192),
        ModelSpec(name="llama3-405b", layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, vocab=128256,
                  seq_len=8192),
        # GPT-3 175B: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (n_layers 96,
        # d_model 12288, n_heads 96, d_head 128, context 2048) and Sec. 2.1 (GPT-2 architecture: GELU MLP of
        # 4 * d_model, tied embeddings, 50257-token BPE vocabulary). Biases, LayerNorm biases and the learned
        # position embedding (2048 x 12288) are not counted: about 0.04 B, 0.02 % of the total.
        ModelSpec(name="gpt3-175b", layers=96, hidden=12288, ffn=49152, heads=96, kv_heads=96, vocab=50257,
                  seq_len=2048, gated_mlp=False, tied_embeddings=True),
        # Mixtral 8x7B: config.json of mistralai/Mixtral-8x7B-v0.1 (8 local experts, 2 per token, experts of
        # intermediate size 14336, vocab 32000); seq_len 4096 is a training choice (the config allows 32768).
        ModelSpec(name="mixtral-8x7b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000,
                  seq_len=4096, experts=8, top_k=2, moe_ffn=14336),
        # DeepSeek-V3: config.json of deepseek-ai/DeepSeek-V3 (61 layers, hidden 7168, dense intermediate
        # 18432, 128 heads, 256 routed experts of intermediate 2048, 8 per token, 1 shared, first 3 layers
        # dense, vocab 129280) with its multi-head latent attention (q_lora_rank 1536, kv_lora_rank 512,
        # qk_rope_head_dim 64, v_head_dim = qk_nope_head_dim 128): 671.0B total, 37.5B active, as the paper's
        # 671B and 37B (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 4.2). kv_bytes still counts up-projected K and
        # V of 128-wide heads (32768 values per token and layer; the cached latent is 576). The
        # multi-token-prediction module (14B, outside the 671B) is not modelled.
        ModelSpec(name="deepseek-v3", layers=61, hidden=7168, ffn=18432, heads=128, kv_heads=128, head_dim=128,
                  vocab=129280, seq_len=4096, experts=256, top_k=8, moe_ffn=2048, shared_experts=1,
                  dense_layers=3, q_lora_rank=1536, kv_lora_rank=512, rope_head_dim=64),
    ]
    return MappingProxyType({spec.name: spec for spec in specs})


PRESETS: Mapping[str, ModelSpec] = _presets()
"""Named models, read-only; derive variants with :meth:`ModelSpec.with_`."""


def preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive)."""
    spec = PRESETS.get(str(name).strip().lower())
    if spec is None:
        raise ScenarioError(f"unknown model {name!r}", field="model", fix=f"use one of: {', '.join(PRESETS)}")
    return spec
