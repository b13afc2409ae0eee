"""Read model shapes from a Hugging Face ``config.json`` (plain JSON: transformers is not needed), or from
DeepSeek's own inference config (``inference/configs/config_671B.json``: ``dim``, ``n_layers``, ...).

The importer is the one place in ``workload/`` that touches files; it maps each architecture's key
names onto :class:`~lightrail.workload.model.ModelSpec`, names the format it read, lists every missing key
at once, and refuses keys that change the model's size which it cannot express (never ignores them).
"""

from __future__ import annotations

import json
import math
import numbers
import re
from pathlib import Path

from lightrail.errors import ScenarioError
from lightrail.workload.model import PRESETS, ModelSpec

__all__ = ["model_from_hf_config"]

# Architectures with a gated MLP whatever their activation is called (Gemma's GeGLU says "gelu_pytorch_tanh").
_GATED_ARCHS = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "deepseek_v2", "deepseek_v3", "olmo", "olmo2", "olmoe", "phi3", "granite", "granitemoe", "cohere",
})
_GATED_ACTS = frozenset({"silu", "swish", "swiglu", "geglu"})


def _load(config: dict | str | Path) -> tuple[dict, str, str | None]:
    """The parsed config, a label for error messages, and a name guessed from the file's location."""
    if isinstance(config, dict):
        return config, "config.json", None
    if isinstance(config, str) and config.lstrip().startswith("{"):
        text, label, path = config, "config.json", None
    else:
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        label = str(path)
        if not path.exists():
            raise ScenarioError("no such file", field=label,
                                fix="give the path of a config.json, or of the directory holding one")
        from lightrail.validation import read_bounded  # bounded: /dev/zero or a FIFO is refused, not read

        text = read_bounded(path, field=label, what="a Hugging Face config.json (a regular file)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"not JSON ({exc.msg} at line {exc.lineno})", field=label,
                            fix="give a Hugging Face config.json") from None
    except RecursionError:
        raise ScenarioError("nested too deeply to be a model config", field=label,
                            fix="give a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"holds a {type(data).__name__}, not an object", field=label,
                            fix="give a Hugging Face config.json (a JSON object of model settings)")
    guess = None
    if path is not None:
        guess = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return data, label, guess


# ModelSpec inputs and the keys that give them: Hugging Face names (architectures differ) first, then the name in
# DeepSeek's inference format (its ModelArgs, inference/model.py of deepseek-ai/DeepSeek-V3). A config is read
# under either set of names, so a hand-renamed mix of the two is read too, never half-ignored.
_KEYS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "hidden": (("hidden_size", "n_embd"), "dim"),
    "layers": (("num_hidden_layers", "n_layer"), "n_layers"),
    "heads": (("num_attention_heads", "n_head"), "n_heads"),
    "ffn": (("intermediate_size", "n_inner"), "inter_dim"),
    "vocab": (("vocab_size",), "vocab_size"),
    "seq_len": (("max_position_embeddings", "n_positions"), "max_seq_len"),
    "experts": (("num_local_experts", "n_routed_experts", "num_experts"), "n_routed_experts"),
    "top_k": (("num_experts_per_tok",), "n_activated_experts"),
    "moe_ffn": (("moe_intermediate_size",), "moe_inter_dim"),
    "shared_experts": (("n_shared_experts",), "n_shared_experts"),
    "dense_layers": (("first_k_dense_replace",), "n_dense_layers"),
    "q_lora_rank": (("q_lora_rank",), "q_lora_rank"),
    "kv_lora_rank": (("kv_lora_rank",), "kv_lora_rank"),
    "qk_nope_head_dim": (("qk_nope_head_dim",), "qk_nope_head_dim"),
    "rope_head_dim": (("qk_rope_head_dim",), "qk_rope_head_dim"),
    "v_head_dim": (("v_head_dim",), "v_head_dim"),
}
_DEEPSEEK_REQUIRED = ("hidden", "ffn", "moe_ffn", "layers", "dense_layers", "heads", "experts", "shared_experts",
                      "top_k", "vocab", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "rope_head_dim",
                      "v_head_dim")
"""Every size key of DeepSeek's format (all in its official configs): its ModelArgs defaults are DeepSeek-V2-Lite's,
so a missing one is asked for, not filled in."""
_DEEPSEEK_SEQ_LEN = 4096 * 4  # ModelArgs.max_seq_len's default; the official configs do not set it
_DEEPSEEK_ONLY = frozenset({"dim", "inter_dim", "moe_inter_dim", "n_layers", "n_dense_layers", "n_heads",
                            "n_activated_experts"})
"""Keys only DeepSeek's format has: a config holding one (say, renamed to HF names by hand, in part) is DeepSeek's
model, whose MLP is gated and whose output head is its own whatever ``model_type`` says."""
_HF_MARKERS = ("hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head",
               "model_type", "architectures")
_READ = {k for hf, ds in _KEYS.values() for k in (*hf, ds) if k} | {
    "head_dim", "num_key_value_heads", "shared_expert_intermediate_size", "moe_layer_freq", "decoder_sparse_step",
    "mlp_only_layers"}
_MOE_NEUTRAL = frozenset({
    # MoE keys that route tokens or train the router but add no weight beyond the router ModelSpec counts.
    "n_group", "topk_group", "topk_method", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "ep_size",
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "router_z_loss_coef", "aux_loss_alpha",
    "seq_aux", "n_expert_groups", "n_limited_groups", "route_scale", "score_func", "moe_layer_freq",
    "decoder_sparse_step", "mlp_only_layers", "moe_router_dtype", "moe_token_dispatcher_type", "expert_capacity",
})
_MOE_KEY = re.compile(r"expert|moe", re.IGNORECASE)


def _format(data: dict) -> str | None:
    """``hf``, ``deepseek`` (DeepSeek's inference format) or None (neither)."""
    if any(k in data for k in _HF_MARKERS):
        return "hf"
    if "dim" in data and ("n_layers" in data or "n_heads" in data):
        return "deepseek"
    return None


def closest_preset(values: dict[str, int]) -> str:
    """The preset nearest to the sizes read (``hidden``, ``layers``, ...): least summed log-ratio, MoE-ness
    counted; with no size known, the preset sharing most values with the file's numbers (``values['*']``)."""
    known = {k: v for k, v in values.items() if k != "*" and isinstance(v, int) and v > 0}
    if not known:
        numbers_ = set(values.get("*", ()))
        return max(PRESETS, key=lambda n: sum(getattr(PRESETS[n], f) in numbers_
                                               for f in ("hidden", "layers", "heads", "ffn", "vocab", "experts")))

    def distance(spec: ModelSpec) -> float:
        return sum(abs(math.log((v + 1) / (getattr(spec, k) + 1))) for k, v in known.items() if hasattr(spec, k))

    return min(PRESETS, key=lambda n: distance(PRESETS[n]))


class _Reader:
    """Typed look-ups in one config, naming ``<label>: <key>`` in every error; missing keys are collected so
    that one error lists them all (:meth:`raise_missing`)."""

    def __init__(self, data: dict, label: str, fmt: str):
        self.data, self.label, self.fmt = data, label, fmt
        self.missing: list[str] = []
        self.values: dict[str, int] = {}

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _value(self, key: str) -> int:
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ScenarioError(f"{value!r} is not an integer", field=f"{self.label}: {key}",
                                fix="fix the config's value")
        return int(value)

    def integer(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            if self.data.get(key) is not None:
                return self._value(key)
        if default is None:
            self.missing.append(keys[0])
            return 1  # a stand-in: raise_missing stops the import before it is used
        return default

    def field(self, name: str, *, default: int | None = None, required: bool | None = None) -> int:
        """A ModelSpec input under any of its names (:data:`_KEYS`); missing ones are named as the format names
        them. ``required`` (DeepSeek's size keys) overrides ``default``."""
        hf, ds = _KEYS[name]
        names = (*hf, ds) if ds and ds not in hf else hf
        if self.fmt == "deepseek" and ds:
            names = (ds, *[k for k in names if k != ds])
        value = self.integer(*names, default=None if required else default)
        if not (self.missing and self.missing[-1] == names[0]):
            self.values[name] = value
        return value

    def raise_missing(self) -> None:
        if not self.missing:
            return
        keys = list(dict.fromkeys(self.missing))
        if self.fmt == "deepseek":  # in the order DeepSeek's own configs list them
            order = [_KEYS[f][1] for f in _DEEPSEEK_REQUIRED]
            keys.sort(key=lambda k: order.index(k) if k in order else len(order))
        kind = "DeepSeek inference config" if self.fmt == "deepseek" else "config"
        closest = closest_preset(self.values)
        if len(keys) == 1:
            raise ScenarioError("missing required field", field=f"{self.label}: {keys[0]}",
                                fix=f"add {keys[0]} to the {kind} (closest preset: {closest})")
        raise ScenarioError(f"missing required fields ({len(keys)})", field=f"{self.label}: {', '.join(keys)}",
                            fix=f"add them to the {kind}, or use the closest preset: {closest}")


def _not_a_config(data: dict, label: str) -> ScenarioError:
    """The error for a JSON object that is no model config this importer knows, with the preset closest to it."""
    numbers_ = [v for v in data.values() if isinstance(v, int) and not isinstance(v, bool)]
    closest = closest_preset({"*": numbers_})
    keys = ", ".join(list(data)[:8]) + (", ..." if len(data) > 8 else "")
    if isinstance(data.get("text_config"), dict):
        return ScenarioError("a multimodal config: the language model's settings are under text_config",
                             field=label, fix="save the text_config section as its own config.json and give that")
    return ScenarioError(f"not a Hugging Face config.json (none of {', '.join(_HF_MARKERS[:6])}) nor DeepSeek's "
                         f"inference config (dim, n_layers, n_heads); its keys: {keys or 'none'}", field=label,
                         fix=f"give the model's config.json from Hugging Face, or a preset (closest: {closest})")


def _refuse_unread_moe_keys(data: dict, label: str) -> None:
    """MoE keys this importer neither reads nor knows to be size-neutral change the weights in ways ModelSpec
    may not express: name them all rather than count a different model."""
    unread = [k for k in data if _MOE_KEY.search(k) and k not in _READ and k not in _MOE_NEUTRAL
              and data[k] not in (None, False, 0, [], {})]
    if unread:
        raise ScenarioError(f"MoE key{'s' if len(unread) > 1 else ''} not modelled: {', '.join(unread)}",
                            field=f"{label}: {unread[0]}",
                            fix="describe the model with ModelSpec(...) directly (experts, top_k, moe_ffn, "
                                "shared_experts, dense_layers)")


def model_from_hf_config(config: dict | str | Path, *, name: str | None = None,
                         seq_len: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` or DeepSeek's inference config.

    Parameters
    ----------
    config : the parsed dict, a path to the file (or to its directory), or its JSON text.
    name : the spec's name; else ``_name_or_path``, else the file's directory or stem, else ``model_type``.
    seq_len : the training sequence length; else ``max_position_embeddings`` (``n_positions``), which for
        long-context models (Llama 3.1: 131072) is usually more than a training job uses.

    Raises
    ------
    ScenarioError : the file is missing, not JSON, or neither format (with the closest preset); required keys
        are missing (all of them named at once) or not integers; or the model has a layout ModelSpec cannot
        express (experts on every k-th layer, per-layer lists, MoE keys it does not read).

    Notes
    -----
    Llama/Mistral/Mixtral/Qwen/DeepSeek keys and GPT-2 keys (``n_layer``, ``n_embd``, ``n_head``,
    ``n_inner``, ``n_positions``) are read. Experts come from ``num_local_experts`` (Mixtral),
    ``n_routed_experts`` (DeepSeek) or ``num_experts`` (Qwen-MoE, OLMoE). Multi-head latent attention
    (``kv_lora_rank``, DeepSeek-V2/V3) is read as such (``q_lora_rank``, ``qk_rope_head_dim``; ``v_head_dim``
    must equal ``qk_nope_head_dim``). DeepSeek's inference format (``dim``, ``inter_dim``, ``moe_inter_dim``,
    ``n_layers``, ``n_dense_layers``, ``n_heads``, ``n_activated_experts``, ...) is read with every size key
    required; its sequence length defaults to its ModelArgs' 16384. DeepSeek-V3's multi-token-prediction module
    (``num_nextn_predict_layers``, 14B) is not counted, as its published 671B does not count it.
    ``torch_dtype`` is the checkpoint's storage type, not what training sends, so ``dtype_bytes`` keeps its
    bf16 default.
    """
    data, label, guess = _load(config)
    fmt = _format(data)
    if fmt is None:
        raise _not_a_config(data, label)
    _refuse_unread_moe_keys(data, label)
    read = _Reader(data, label, fmt)
    ds = fmt == "deepseek"
    model_type = str(data.get("model_type", "deepseek_v3" if ds else "")).lower()
    hidden = read.field("hidden", required=ds)
    heads = read.field("heads", required=ds)
    layers = read.field("layers", required=ds)
    vocab = read.field("vocab", required=ds)
    ds_model = ds or not _DEEPSEEK_ONLY.isdisjoint(data)
    gpt2_ffn = 4 * hidden if read.has("n_embd") else None
    ffn = read.field("ffn", default=gpt2_ffn, required=ds)
    if seq_len is None:
        seq_len = read.field("seq_len", default=_DEEPSEEK_SEQ_LEN if ds else None)
    head_dim = read.integer("head_dim", default=0)
    mla: dict[str, int] = {}
    if ds or read.has("kv_lora_rank"):
        nope = read.field("qk_nope_head_dim", required=True)
        head_dim = read.field("v_head_dim", required=True)
        mla = {"kv_lora_rank": read.field("kv_lora_rank", required=True),
               "q_lora_rank": read.field("q_lora_rank", default=0, required=ds),
               "rope_head_dim": read.field("rope_head_dim", required=True)}
    experts = read.field("experts", default=0, required=ds)
    moe: dict[str, int] = {}
    if experts:
        moe = {"experts": experts, "top_k": read.field("top_k", required=True),
               "moe_ffn": read.field("moe_ffn", default=ffn, required=ds),
               "shared_experts": read.field("shared_experts", default=0, required=ds),
               "dense_layers": read.field("dense_layers", default=0, required=ds)}
    else:
        for key in ("top_k", "moe_ffn", "shared_experts", "dense_layers"):
            given = [k for k in (*_KEYS[key][0], _KEYS[key][1]) if k and read.has(k)]
            if given and data[given[0]]:
                raise ScenarioError(f"{given[0]} is set but the config has no experts", field=f"{label}: {given[0]}",
                                    fix="add the expert count (num_local_experts, n_routed_experts or num_experts)")
    kv_heads = read.integer("num_key_value_heads", default=heads)
    read.raise_missing()
    if mla and nope != head_dim:
        raise ScenarioError(f"qk_nope_head_dim {nope} differs from v_head_dim {head_dim}",
                            field=f"{label}: qk_nope_head_dim", fix="describe the model with ModelSpec(...) directly")
    if experts and read.has("shared_expert_intermediate_size"):
        # Qwen-MoE gives its shared expert as one wide MLP: count it in moe_ffn-sized experts.
        width = read.integer("shared_expert_intermediate_size")
        if width % moe["moe_ffn"]:
            raise ScenarioError(f"{width} is not a multiple of moe_intermediate_size {moe['moe_ffn']}",
                                field=f"{label}: shared_expert_intermediate_size",
                                fix="describe the model with ModelSpec(...) directly")
        moe["shared_experts"] = width // moe["moe_ffn"]
    if experts:
        for key in ("moe_layer_freq", "decoder_sparse_step"):
            if read.integer(key, default=1) != 1:
                raise ScenarioError("experts on every k-th layer are not modelled", field=f"{label}: {key}",
                                    fix="describe the model with ModelSpec(...) directly")
        if data.get("mlp_only_layers"):
            raise ScenarioError("per-layer dense exceptions are not modelled", field=f"{label}: mlp_only_layers",
                                fix="describe the model with ModelSpec(...) directly")
    act = str(data.get("hidden_act", data.get("activation_function", ""))).lower()
    return ModelSpec(
        name=name or data.get("_name_or_path") or guess or model_type or "hf-model",
        layers=layers,
        hidden=hidden,
        ffn=ffn,
        heads=heads,
        kv_heads=kv_heads,
        vocab=vocab,
        seq_len=seq_len,
        head_dim=head_dim,
        gated_mlp=ds_model or model_type in _GATED_ARCHS or act in _GATED_ACTS,
        # PretrainedConfig defaults tie_word_embeddings to True; Llama and Mixtral configs say false, and
        # DeepSeek's inference model has its own output head.
        tied_embeddings=False if ds_model else bool(data.get("tie_word_embeddings", True)),
        **mla,
        **moe,
    )
