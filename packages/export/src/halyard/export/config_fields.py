"""What each family's ``config.json`` keys mean as Halyard config fields (the readers `config_reading` runs).

``used`` sets collect the keys a reader consumed; `config_reading` checks them against the family's
`KeyRule`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.export.errors import UnsupportedModelError
from halyard.models import (
    Gpt2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    ModelConfig,
    Qwen2Config,
)
from halyard.models.rotary import RotaryConfig

# Keys that fix the weights' shapes: a config.json without them is refused.
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head"),
    **{
        family: ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        for family in ("llama", "mistral", "qwen2", "mixtral")
    },
}

# transformers' defaults for keys a config.json may omit (they differ from Halyard's defaults, e.g. the
# RMSNorm epsilon): an omitted key means what it means to transformers.
_LLAMA_DEFAULTS = {"hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "n_inner": None,
        "n_positions": 1024,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    },
    "llama": {**_LLAMA_DEFAULTS, "max_position_embeddings": 2048, "rope_theta": 10000.0},
    "mistral": {
        **_LLAMA_DEFAULTS,
        "max_position_embeddings": 131072,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "rope_theta": 10000.0,
    },
    "qwen2": {**_LLAMA_DEFAULTS, "max_position_embeddings": 32768, "rope_theta": 10000.0},
    "mixtral": {
        **_LLAMA_DEFAULTS,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "num_key_value_heads": 8,
        "rope_theta": 1e6,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.001,
    },
}


def _rope(hf: Mapping[str, Any], used: set[str]) -> RotaryConfig:
    used.update({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"})
    parameters = hf.get("rope_parameters") or hf.get("rope_scaling")
    theta = hf.get("rope_theta", (parameters or {}).get("rope_theta", 10000.0))
    partial = hf.get("partial_rotary_factor", 1.0)
    rope = RotaryConfig.from_hf(theta, dict(parameters) if parameters else None, partial)
    if rope.partial_rotary_factor != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor={rope.partial_rotary_factor}: these Hugging Face architectures rotate "
            "the whole head, so a partial rotary factor is not a checkpoint they can hold"
        )
    return rope


# transformers' Qwen2Config default for max_window_layers (a config.json may omit it).
_QWEN2_MAX_WINDOW_LAYERS = 28


def _sliding_window(family: str, hf: Mapping[str, Any], used: set[str]) -> tuple[int | None, int]:
    """``(sliding_window, full_attention_layers)`` from ``sliding_window``, ``use_sliding_window``,
    ``max_window_layers`` and ``layer_types``, by transformers' rule: ``layer_types`` when given, else (Qwen2)
    the layers from ``max_window_layers`` on use the window."""
    used.update({"sliding_window", "layer_types"})
    if family == "qwen2":
        used.update({"use_sliding_window", "max_window_layers"})
    window = hf.get("sliding_window")
    if family == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    layer_types = hf.get("layer_types")
    num_layers = int(hf["num_hidden_layers"])
    if layer_types is None and family == "qwen2" and window is not None:
        full = min(int(hf.get("max_window_layers", _QWEN2_MAX_WINDOW_LAYERS)), num_layers)
        layer_types = ["full_attention"] * full + ["sliding_attention"] * (num_layers - full)
    if layer_types is not None:
        layer_types = list(layer_types)
        if set(layer_types) == {"full_attention"}:
            return None, 0
        full = layer_types.index("sliding_attention") if "sliding_attention" in layer_types else -1
        prefix = ["full_attention"] * full + ["sliding_attention"] * (len(layer_types) - full)
        if window is not None and full >= 0 and layer_types == prefix and (full == 0 or family == "qwen2"):
            if len(layer_types) != num_layers:
                raise UnsupportedModelError(
                    f"layer_types lists {len(layer_types)} layers but num_hidden_layers={num_layers}"
                )
            return int(window), full
        raise UnsupportedModelError(
            f"layer_types {layer_types} (sliding_window={window}) for model_type {family!r}: Halyard "
            "supports every layer full_attention, every layer sliding_attention with a sliding_window, or "
            "(qwen2) full_attention layers followed by sliding_attention layers"
        )
    if window is not None and family in ("llama", "gpt2"):
        raise UnsupportedModelError(f"sliding_window={window} is not an option of model_type {family!r}")
    return (None if window is None else int(window)), 0


def llama_fields(family: str, hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """Llama, Mistral, Qwen2 and Mixtral fields from ``hf`` (defaults filled in); ``used`` collects the keys
    read."""
    names = {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "max_position_embeddings": "max_position",
        "rms_norm_eps": "rms_norm_eps",
        "hidden_act": "activation",
        "initializer_range": "initializer_range",
    }
    fields = {ours: hf[theirs] for theirs, ours in names.items() if theirs in hf}
    used.update(names)
    used.update({"num_key_value_heads", "head_dim", "tie_word_embeddings"})
    fields["num_kv_heads"] = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    head_dim = hf.get("head_dim")
    # a head_dim equal to the default is stated by newer transformers versions only: keep configs equal
    fields["head_dim"] = None if head_dim == hf["hidden_size"] // hf["num_attention_heads"] else head_dim
    fields["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
    fields["rope"] = _rope(hf, used)
    fields["sliding_window"], full_attention_layers = _sliding_window(family, hf, used)
    if full_attention_layers:
        fields["full_attention_layers"] = full_attention_layers
    if family == "llama":
        used.update({"attention_bias", "mlp_bias"})
        fields["attention_bias"] = bool(hf.get("attention_bias", False))
        fields["mlp_bias"] = bool(hf.get("mlp_bias", False))
    if family == "mixtral":
        moe = {
            "num_local_experts": "num_experts",
            "num_experts_per_tok": "num_experts_per_token",
            "router_aux_loss_coef": "router_aux_loss_coef",
        }
        fields.update({ours: hf[theirs] for theirs, ours in moe.items() if theirs in hf})
        used.update(moe)
    return fields


def gpt2_fields(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """GPT-2 fields from ``hf`` (defaults filled in); ``used`` collects the keys read."""
    names = {
        "vocab_size": "vocab_size",
        "n_embd": "hidden_size",
        "n_layer": "num_layers",
        "n_head": "num_heads",
        "n_inner": "intermediate_size",
        "n_positions": "max_position",
        "layer_norm_epsilon": "layer_norm_eps",
        "activation_function": "activation",
        "initializer_range": "initializer_range",
    }
    used.update(names)
    return {ours: hf[theirs] for theirs, ours in names.items() if theirs in hf}


CLASSES: dict[str, type[ModelConfig]] = {
    "gpt2": Gpt2Config,
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "mixtral": MixtralConfig,
}
