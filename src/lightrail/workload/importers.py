"""Read model shapes from a Hugging Face ``config.json`` (plain JSON: transformers is not needed).

The importer is the one place in ``workload/`` that touches files; it maps each architecture's key
names onto :class:`~lightrail.workload.model.ModelSpec` and says which key is missing or wrong.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path

from lightrail.errors import ScenarioError
from lightrail.workload.model import ModelSpec

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


class _Reader:
    """Typed look-ups in one config, naming ``<label>: <key>`` in every error."""

    def __init__(self, data: dict, label: str):
        self.data, self.label = data, label

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ScenarioError(f"{value!r} is not an integer", field=f"{self.label}: {key}",
                                    fix="fix the config.json value")
            return int(value)
        if default is None:
            raise ScenarioError("missing required field", field=f"{self.label}: {keys[0]}",
                                fix=f"add {' or '.join(keys)} to the config")
        return default


def model_from_hf_config(config: dict | str | Path, *, name: str | None = None,
                         seq_len: int | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json``.

    Parameters
    ----------
    config : the parsed dict, a path to the file (or to its directory), or its JSON text.
    name : the spec's name; else ``_name_or_path``, else the file's directory or stem, else ``model_type``.
    seq_len : the training sequence length; else ``max_position_embeddings`` (``n_positions``), which for
        long-context models (Llama 3.1: 131072) is usually more than a training job uses.

    Raises
    ------
    ScenarioError : the file is missing or not JSON, a required key is missing or not an integer, or
        the MoE layout is one ModelSpec cannot express (experts on every k-th layer, per-layer lists).

    Notes
    -----
    Llama/Mistral/Mixtral/Qwen/DeepSeek keys and GPT-2 keys (``n_layer``, ``n_embd``, ``n_head``,
    ``n_inner``, ``n_positions``) are read. Experts come from ``num_local_experts`` (Mixtral),
    ``n_routed_experts`` (DeepSeek) or ``num_experts`` (Qwen-MoE, OLMoE). A DeepSeek config with
    multi-head latent attention (``kv_lora_rank``) is read as attention with ``v_head_dim``-wide heads,
    the approximation the ``deepseek-v3`` preset documents. ``torch_dtype`` is the checkpoint's storage
    type, not what training sends, so ``dtype_bytes`` keeps its bf16 default.
    """
    data, label, guess = _load(config)
    read = _Reader(data, label)
    model_type = str(data.get("model_type", "")).lower()
    hidden = read.integer("hidden_size", "n_embd")
    heads = read.integer("num_attention_heads", "n_head")
    head_dim = read.integer("head_dim", default=0)
    if read.has("kv_lora_rank"):
        head_dim = read.integer("v_head_dim")
    experts = read.integer("num_local_experts", "n_routed_experts", "num_experts", default=0)
    ffn = read.integer("intermediate_size", "n_inner", default=4 * hidden if read.has("n_embd") else None)
    moe: dict[str, int] = {}
    if experts:
        moe_ffn = read.integer("moe_intermediate_size", default=ffn)
        moe = {"experts": experts, "top_k": read.integer("num_experts_per_tok"), "moe_ffn": moe_ffn,
               "shared_experts": read.integer("n_shared_experts", default=0),
               "dense_layers": read.integer("first_k_dense_replace", default=0)}
        if read.has("shared_expert_intermediate_size"):
            # Qwen-MoE gives its shared expert as one wide MLP: count it in moe_ffn-sized experts.
            width = read.integer("shared_expert_intermediate_size")
            if width % moe_ffn:
                raise ScenarioError(f"{width} is not a multiple of moe_intermediate_size {moe_ffn}",
                                    field=f"{label}: shared_expert_intermediate_size",
                                    fix="describe the model with ModelSpec(...) directly")
            moe["shared_experts"] = width // moe_ffn
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
        layers=read.integer("num_hidden_layers", "n_layer"),
        hidden=hidden,
        ffn=ffn,
        heads=heads,
        kv_heads=read.integer("num_key_value_heads", default=heads),
        vocab=read.integer("vocab_size"),
        seq_len=seq_len if seq_len is not None else read.integer("max_position_embeddings", "n_positions"),
        head_dim=head_dim,
        gated_mlp=model_type in _GATED_ARCHS or act in _GATED_ACTS,
        # PretrainedConfig defaults tie_word_embeddings to True; Llama and Mixtral configs say false.
        tied_embeddings=bool(data.get("tie_word_embeddings", True)),
        **moe,
    )
