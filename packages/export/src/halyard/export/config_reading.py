"""``config.json`` <-> Halyard model configs, read and written without `transformers`.

Reading is strict: every key must be understood. A key is either mapped to a Halyard field, known to
leave the model's function unchanged (dropout rates, generation defaults, bookkeeping), or required to
hold the one value Halyard implements (e.g. GPT-2's ``scale_attn_weights: true``). Anything else is an
`UnsupportedModelError` naming the key, so a checkpoint never loads into a model that computes
something different from what its authors trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from halyard.export.errors import UnsupportedModelError
from halyard.export.families import HF_ARCHITECTURES
from halyard.models import (
    Gpt2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    ModelConfig,
    Qwen2Config,
    registered_models,
)
from halyard.models.rotary import RotaryConfig

# Keys of any Hugging Face config that do not change the decoder's function: bookkeeping, generation
# defaults, heads other than the causal-LM head, and dropout (Halyard trains without dropout).
NEUTRAL_KEYS = frozenset(
    [
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "_name_or_path",
        "name_or_path",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "is_decoder",
        "cross_attention_hidden_size",
        "output_router_logits",
        "attention_dropout",
        "attn_pdrop",
        "embd_pdrop",
        "resid_pdrop",
        "router_jitter_noise",
        "initializer_range",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "n_ctx",
        "reorder_and_upcast_attn",
        "max_window_layers",
    ]
)

# Keys Halyard accepts only with one value (the behaviour it implements).
REQUIRED_VALUES: dict[str, Any] = {
    "pretraining_tp": 1,
    "add_cross_attention": False,
    "is_encoder_decoder": False,
    "tie_encoder_decoder": False,
    "pruned_heads": {},
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
}

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

_FAMILY_BY_MODEL_TYPE = {model_type: family for family, (model_type, _) in HF_ARCHITECTURES.items()}


@dataclasses.dataclass(frozen=True)
class HfModelInfo:
    """What a ``config.json`` says besides the Halyard config.

    Attributes:
        family: the Halyard family (``"llama"``...).
        vocab_size: the checkpoint's embedding rows (before any padding for a mesh).
        bos_token_id, eos_token_id, pad_token_id: the special ids, when the config names them.
    """

    family: str
    vocab_size: int
    bos_token_id: Any = None
    eos_token_id: Any = None
    pad_token_id: Any = None


def _refuse_remote_code(hf: Mapping[str, Any], where: str) -> None:
    if "auto_map" in hf:
        raise UnsupportedModelError(
            f"{where} has 'auto_map' {hf['auto_map']}: the model needs its own Python code "
            "(trust_remote_code). Halyard never runs code from a checkpoint; convert it to a supported "
            f"architecture ({', '.join(arch for _, arch in HF_ARCHITECTURES.values())}) first"
        )


def detect_family(hf: Mapping[str, Any], where: str) -> str:
    """The Halyard family of a ``config.json``, from ``model_type`` and ``architectures``.

    Raises:
        UnsupportedModelError: remote code, an unknown model type, or an architecture other than the
            causal-LM head of that type.
    """
    _refuse_remote_code(hf, where)
    model_type = hf.get("model_type")
    family = _FAMILY_BY_MODEL_TYPE.get(str(model_type))
    if family is None or family not in registered_models():
        supported = sorted(t for f, (t, _) in HF_ARCHITECTURES.items() if f in registered_models())
        raise UnsupportedModelError(
            f"{where}: model_type {model_type!r} (architectures {hf.get('architectures')}) is not supported; "
            f"Halyard imports model types {supported}"
        )
    expected = HF_ARCHITECTURES[family][1]
    architectures = hf.get("architectures") or [expected]
    if list(architectures) != [expected]:
        raise UnsupportedModelError(
            f"{where}: architectures {architectures} are not supported for model_type {model_type!r}; "
            f"Halyard imports the causal language model {expected!r} only"
        )
    return family


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
    used.update({"sliding_window", "use_sliding_window", "layer_types", "max_window_layers"})
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


def _llama_fields(family: str, hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
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
    used.update({"num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias"})
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
        fields["attention_bias"] = bool(hf.get("attention_bias", False))
        fields["mlp_bias"] = bool(hf.get("mlp_bias", False))
    elif "attention_bias" in hf or "mlp_bias" in hf:
        _require(hf, "attention_bias", family == "qwen2")
        _require(hf, "mlp_bias", False)
    if family == "mixtral":
        moe = {
            "num_local_experts": "num_experts",
            "num_experts_per_tok": "num_experts_per_token",
            "router_aux_loss_coef": "router_aux_loss_coef",
        }
        fields.update({ours: hf[theirs] for theirs, ours in moe.items() if theirs in hf})
        used.update(moe)
    return fields


def _require(hf: Mapping[str, Any], key: str, value: Any) -> None:
    if key in hf and hf[key] != value:
        raise UnsupportedModelError(
            f"{key}={hf[key]!r} is not supported for this model type (only {value!r})"
        )


def _gpt2_fields(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
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
    used.add("tie_word_embeddings")
    if not hf.get("tie_word_embeddings", True):
        raise UnsupportedModelError(
            "tie_word_embeddings=false: Halyard's GPT-2 always shares the token embedding with the output"
        )
    return {ours: hf[theirs] for theirs, ours in names.items() if theirs in hf}


_CLASSES: dict[str, type[ModelConfig]] = {
    "gpt2": Gpt2Config,
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "mixtral": MixtralConfig,
}


def config_from_hf_dict(
    hf: Mapping[str, Any], *, where: str = "config.json", overrides: Mapping[str, Any] | None = None
) -> tuple[ModelConfig, HfModelInfo]:
    """The Halyard config and the special ids described by a parsed ``config.json``.

    Args:
        hf: the parsed ``config.json``.
        where: how to name the file in messages.
        overrides: Halyard config fields to set on top (``param_dtype``, ``remat``, ...).

    Raises:
        UnsupportedModelError: remote code, an unsupported architecture, an option Halyard does not
            implement, a missing required key, or a value Halyard's config rejects (each message names
            the key).
        TypeError: an unknown field in ``overrides`` (with a suggestion).
    """
    family = detect_family(hf, where)
    missing = [key for key in REQUIRED_KEYS[family] if hf.get(key) is None]
    if missing:
        raise UnsupportedModelError(
            f"{where}: the required key(s) {missing} are missing; they fix the shapes of the weights"
        )
    given = set(hf)
    hf = {**HF_DEFAULTS[family], **hf}
    used: set[str] = set()
    try:
        fields = _gpt2_fields(hf, used) if family == "gpt2" else _llama_fields(family, hf, used)
        for key, value in REQUIRED_VALUES.items():
            _require(hf, key, value)
    except UnsupportedModelError as error:
        raise UnsupportedModelError(f"{where}: {error}") from None
    except ValueError as error:
        raise UnsupportedModelError(f"{where}: {error}") from error
    unknown = sorted(
        key for key in given if key not in used and key not in NEUTRAL_KEYS and key not in REQUIRED_VALUES
    )
    if unknown:
        raise UnsupportedModelError(
            f"{where}: option(s) {unknown} of model_type {hf.get('model_type')!r} are not supported by "
            "Halyard's import; they may change what the model computes, so the checkpoint is refused "
            "rather than loaded into a different model"
        )
    try:
        config = _CLASSES[family](**fields)
    except (TypeError, ValueError) as error:
        raise UnsupportedModelError(f"{where}: {error}") from error
    if overrides:
        config = config.replace(**overrides)  # an unknown field is a TypeError with a suggestion
    info = HfModelInfo(
        family=family,
        vocab_size=int(hf["vocab_size"]),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
    )
    return config, info
