"""Halyard model configs -> ``config.json`` / ``generation_config.json`` for `transformers`.

Keys use the spelling every `transformers` release since 4.45 reads (``rope_theta`` + ``rope_scaling``,
``head_dim``); a Halyard option the target architecture cannot express is an error, never dropped.
"""

from __future__ import annotations

from typing import Any

from halyard.export.errors import UnsupportedModelError
from halyard.export.families import HF_ARCHITECTURES
from halyard.models import Gpt2Config, LlamaConfig, MixtralConfig, ModelConfig

# Halyard activation names -> transformers' ACT2FN names (where they differ).
_ACTIVATIONS = {"squared_relu": "relu2"}


def _refuse(config: ModelConfig, what: str, fix: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{type(config).__name__} has {what}, which Hugging Face's {HF_ARCHITECTURES[config.family][1]} "
        f"cannot express; {fix}"
    )


def _gpt2(config: Gpt2Config) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size,
        "n_embd": config.hidden_size,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.intermediate_size,
        "n_positions": config.max_position,
        "n_ctx": config.max_position,
        "layer_norm_epsilon": config.layer_norm_eps,
        "activation_function": _ACTIVATIONS.get(config.activation, config.activation),
        "initializer_range": config.initializer_range,
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
    }


def _llama(config: LlamaConfig) -> dict[str, Any]:
    family = config.family
    if config.rope.partial_rotary_factor != 1.0:
        raise _refuse(config, f"rope.partial_rotary_factor={config.rope.partial_rotary_factor}", "use 1.0")
    theta, scaling = config.rope.to_hf()
    values: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": _ACTIVATIONS.get(config.activation, config.activation),
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "attention_dropout": 0.0,
    }
    if config.head_dim is not None:
        values["head_dim"] = config.head_dim
    if family == "llama":
        if config.sliding_window is not None:
            raise _refuse(config, f"sliding_window={config.sliding_window}", "use the mistral family")
        if config.attention_bias and config.qkv_bias_only:
            raise _refuse(config, "q/k/v biases without an output bias", "use the qwen2 family")
        values.update(attention_bias=config.attention_bias, mlp_bias=config.mlp_bias, pretraining_tp=1)
        return values
    if config.mlp_bias:
        raise _refuse(config, "mlp_bias=True", "use the llama family")
    if family == "qwen2":
        if not (config.attention_bias and config.qkv_bias_only):
            raise _refuse(
                config,
                "attention biases other than q/k/v only",
                "use attention_bias=True, qkv_bias_only=True",
            )
        window = config.sliding_window
        values.update(
            use_sliding_window=window is not None,
            sliding_window=window,
            # transformers: the layers from max_window_layers on use the window (when use_sliding_window)
            max_window_layers=config.full_attention_layers if window is not None else config.num_layers,
            layer_types=[
                "full_attention" if layer_window is None else "sliding_attention"
                for layer_window in config.layer_windows
            ],
        )
        return values
    if config.full_attention_layers:
        raise _refuse(
            config,
            f"full_attention_layers={config.full_attention_layers} (a window on only some layers)",
            "use the qwen2 family",
        )
    if config.attention_bias:
        raise _refuse(config, "attention_bias=True", "use the llama or qwen2 family")
    values["sliding_window"] = config.sliding_window
    if isinstance(config, MixtralConfig):
        values.update(
            num_local_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_token,
            router_aux_loss_coef=config.router_aux_loss_coef,
            output_router_logits=False,
            router_jitter_noise=0.0,
        )
    return values


def config_to_hf_dict(
    config: ModelConfig,
    *,
    vocab_size: int,
    dtype: str,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of a Halyard config.

    Args:
        config: a gpt2 / llama / mistral / qwen2 / mixtral config.
        vocab_size: embedding rows written (the model's size minus any padding).
        dtype: ``"float32"`` or ``"bfloat16"``: the weights' dtype, recorded in the config.
        bos_token_id, eos_token_id, pad_token_id: special ids (None: unknown; ``eos_token_id`` may be a
            list of ids).

    Raises:
        UnsupportedModelError: the family has no Hugging Face architecture or an option that it cannot
            express (named, with the family to use instead).
    """
    if config.family not in HF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"Halyard family {config.family!r} has no Hugging Face architecture to export to; supported: "
            f"{', '.join(sorted(HF_ARCHITECTURES))}"
        )
    model_type, architecture = HF_ARCHITECTURES[config.family]
    body = _gpt2(config) if isinstance(config, Gpt2Config) else _llama(config)  # type: ignore[arg-type]
    body["vocab_size"] = vocab_size
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **body,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "dtype": dtype,
        "use_cache": True,
    }


def generation_config_dict(
    bos_token_id: int | None, eos_token_id: int | list[int] | None, pad_token_id: int | None
) -> dict[str, Any]:
    """``generation_config.json``: the special ids `generate` needs (unknown ones are left out; every
    EOS id, so `generate` stops at each)."""
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    return {"_from_model_config": True, **{key: value for key, value in ids.items() if value is not None}}
