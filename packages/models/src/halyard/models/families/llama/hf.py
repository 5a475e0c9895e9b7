"""The Hugging Face counterparts of Llama, Mistral and Qwen2 (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``): their config keys and where their weights live. The three share one layer, one
tensor layout and most keys; they differ in biases and in which layers use a sliding window.

``nn.Linear`` stores ``[out, in]``; Halyard's `Linear` stores ``(in..., out...)``, so projections transpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama.config import LlamaConfig
from halyard.models.hf import (
    COMMON_RULE,
    HfFamily,
    KeyRule,
    TensorMapping,
    UnsupportedModelError,
    names,
    register_hf,
)
from halyard.models.hf.readers import (
    FULL,
    SLIDING,
    activation_from_hf,
    full_then_windowed,
    head_dim,
    layer_windows,
    renamed,
    rope,
)
from halyard.models.hf.writers import activation_to_hf, layer_types, refusal, rope_keys

# The keys transformers' LlamaConfig / MistralConfig / Qwen2Config (and MixtralConfig, which adds its
# own) and their modeling_*.py read (packages/export/tests/test_key_rules.py checks them).
LLAMA_LIKE_RULE = COMMON_RULE + KeyRule(
    implemented=names(
        "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads",
        "num_key_value_heads head_dim max_position_embeddings rms_norm_eps hidden_act",
        "initializer_range tie_word_embeddings rope_parameters rope_scaling rope_theta",
        "partial_rotary_factor sliding_window layer_types",
    ),
    fixed={
        "pretraining_tp": (1, None),  # transformers < 4.40 split the projections into this many slices
        # not read by these architectures, but a true value says the weights expect another rotation
        "rope_interleaved": (False,),
        "use_mrope": (False,),
    },
)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# transformers' values where Halyard's differ (e.g. the RMSNorm epsilon): an omitted key means what it
# means to transformers.
LLAMA_LIKE_DEFAULTS = {
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}

# config.json key -> LlamaConfig field, for the keys every Llama-like architecture names the same way
LLAMA_LIKE_FIELDS = {
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


def read_common(
    hf: Mapping[str, Any], used: set[str], *, partial: bool = False, original_max_position: bool = False
) -> dict[str, Any]:
    """The `LlamaConfig` fields every Llama-like architecture reads the same way (no windows, no biases);
    ``partial`` and ``original_max_position`` as in `halyard.models.hf.readers.rope` (Phi-3 sets both)."""
    fields = renamed(hf, used, LLAMA_LIKE_FIELDS)
    fields["activation"] = activation_from_hf(fields["activation"])
    used.update({"num_key_value_heads", "tie_word_embeddings"})
    fields["num_kv_heads"] = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    fields["head_dim"] = head_dim(hf, used)
    fields["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
    fields["rope"] = rope(hf, used, partial=partial, original_max_position=original_max_position)
    return fields


def uniform_window(hf: Mapping[str, Any], used: set[str], architecture: str) -> int | None:
    """``sliding_window`` of an architecture that applies it to every layer (Mistral, Mixtral).

    Raises:
        UnsupportedModelError: a ``layer_types`` with full-attention layers before windowed ones.
    """
    used.add("sliding_window")
    windows = layer_windows(
        hf, used, window=hf.get("sliding_window"), num_layers=int(hf["num_hidden_layers"])
    )
    window, full = full_then_windowed(windows, what=architecture)
    if full:
        raise UnsupportedModelError(
            f"layer_types {layer_types(windows)}: {architecture} gives every layer the same attention (a "
            "window from some layer on is Qwen2's use_sliding_window with max_window_layers)"
        )
    return window


def _read_llama(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    fields = read_common(hf, used)
    used.update({"sliding_window", "attention_bias", "mlp_bias"})
    if hf.get("sliding_window") is not None:
        raise UnsupportedModelError(
            f"sliding_window={hf['sliding_window']} is not an option of model_type 'llama'"
        )
    layer_windows(hf, used, window=None, num_layers=fields["num_layers"])  # refuses sliding layer types
    fields["attention_bias"] = bool(hf.get("attention_bias", False))
    fields["mlp_bias"] = bool(hf.get("mlp_bias", False))
    return fields


def _read_mistral(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    return {**read_common(hf, used), "sliding_window": uniform_window(hf, used, "MistralForCausalLM")}


def qwen2_windows(hf: Mapping[str, Any], used: set[str], *, architecture: str) -> dict[str, Any]:
    """``sliding_window`` and ``full_attention_layers`` by transformers' Qwen2 rule (Qwen3 too):
    ``sliding_window`` counts only with ``use_sliding_window``; ``layer_types`` when given, else the layers
    from ``max_window_layers`` on use the window."""
    used.update({"sliding_window", "use_sliding_window", "max_window_layers"})
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    num_layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None and window is not None:
        full = min(int(hf["max_window_layers"]), num_layers)
        types = [FULL] * full + [SLIDING] * (num_layers - full)
    windows = layer_windows(hf, used, window=window, num_layers=num_layers, layer_types=types)
    sliding_window, full_layers = full_then_windowed(windows, what=architecture)
    return {
        "sliding_window": sliding_window,
        **({"full_attention_layers": full_layers} if full_layers else {}),
    }


def qwen2_window_keys(config: LlamaConfig) -> dict[str, Any]:
    """The ``config.json`` keys of `qwen2_windows` (``use_sliding_window``, ``max_window_layers``...)."""
    window = config.sliding_window
    return {
        "use_sliding_window": window is not None,
        "sliding_window": window,
        # transformers: the layers from max_window_layers on use the window (when use_sliding_window)
        "max_window_layers": config.full_attention_layers if window is not None else config.num_layers,
        "layer_types": layer_types(config.layer_windows),
    }


def _read_qwen2(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    return {**read_common(hf, used), **qwen2_windows(hf, used, architecture="Qwen2ForCausalLM")}


def write_common(config: LlamaConfig, architecture: str, *, partial: bool = False) -> dict[str, Any]:
    """The ``config.json`` keys every Llama-like architecture writes the same way (with ``partial``, also
    ``partial_rotary_factor``)."""
    values = {theirs: getattr(config, ours) for theirs, ours in LLAMA_LIKE_FIELDS.items()}
    values.update(
        hidden_act=activation_to_hf(config.activation),
        num_key_value_heads=config.num_kv_heads,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=0.0,
        **rope_keys(config.rope, architecture, config, partial=partial),
    )
    if config.head_dim is not None:
        values["head_dim"] = config.head_dim
    return values


def write_uniform_window(config: LlamaConfig, architecture: str) -> dict[str, Any]:
    """Mistral's keys (also Mixtral's base): no biases, one window for every layer or none."""
    if config.mlp_bias:
        raise refusal(config, architecture, "mlp_bias=True", "use the llama family")
    if config.full_attention_layers:
        what = f"full_attention_layers={config.full_attention_layers} (a window on only some layers)"
        raise refusal(config, architecture, what, "use the qwen2 family")
    if config.attention_bias:
        raise refusal(config, architecture, "attention_bias=True", "use the llama or qwen2 family")
    return {**write_common(config, architecture), "sliding_window": config.sliding_window}


def _write_llama(config: LlamaConfig) -> dict[str, Any]:
    architecture = "LlamaForCausalLM"
    if config.sliding_window is not None:
        raise refusal(
            config, architecture, f"sliding_window={config.sliding_window}", "use the mistral family"
        )
    if config.attention_bias and config.qkv_bias_only:
        raise refusal(config, architecture, "q/k/v biases without an output bias", "use the qwen2 family")
    return {
        **write_common(config, architecture),
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "pretraining_tp": 1,
    }


def _write_qwen2(config: LlamaConfig) -> dict[str, Any]:
    architecture = "Qwen2ForCausalLM"
    if config.mlp_bias:
        raise refusal(config, architecture, "mlp_bias=True", "use the llama family")
    if not (config.attention_bias and config.qkv_bias_only):
        what, fix = "attention biases other than q/k/v only", "use attention_bias=True, qkv_bias_only=True"
        raise refusal(config, architecture, what, fix)
    return {**write_common(config, architecture), **qwen2_window_keys(config)}


def mappings(config: LlamaConfig, *, mlp: bool = True) -> list[TensorMapping]:
    """Every parameter's tensor; without ``mlp`` all but the MLP's (Mixtral adds its experts)."""
    M = TensorMapping
    layer, stack = "model.layers.{layers}.", "layers.stacked."
    result = [
        M("embed.weight", "model.embed_tokens.weight", "vocab embed -> vocab embed"),
        M("final_norm.weight", "model.norm.weight", "embed -> embed"),
        M(stack + "attention_norm.weight", layer + "input_layernorm.weight", "embed -> embed"),
        M(stack + "mlp_norm.weight", layer + "post_attention_layernorm.weight", "embed -> embed"),
        M(stack + "attention.q_proj.weight", layer + "self_attn.q_proj.weight",
          "(heads head_size) embed -> embed heads head_size"),
        M(stack + "attention.k_proj.weight", layer + "self_attn.k_proj.weight",
          "(kv_heads head_size) embed -> embed kv_heads head_size"),
        M(stack + "attention.v_proj.weight", layer + "self_attn.v_proj.weight",
          "(kv_heads head_size) embed -> embed kv_heads head_size"),
        M(stack + "attention.o_proj.weight", layer + "self_attn.o_proj.weight",
          "embed (heads head_size) -> heads head_size embed"),
    ]  # fmt: skip
    if not config.tie_embeddings:
        result.append(M("lm_head.weight", "lm_head.weight", "vocab embed -> embed vocab"))
    if config.attention_bias:
        for name, heads in (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads")):
            result.append(
                M(f"{stack}attention.{name}.bias", f"{layer}self_attn.{name}.bias",
                  f"({heads} head_size) -> {heads} head_size")
            )  # fmt: skip
        if not config.qkv_bias_only:
            result.append(
                M(stack + "attention.o_proj.bias", layer + "self_attn.o_proj.bias", "embed -> embed")
            )
    if not mlp:
        return result
    for ours, theirs, into, out in (
        ("gate", "gate_proj", "embed", "mlp"),
        ("up", "up_proj", "embed", "mlp"),
        ("down", "down_proj", "mlp", "embed"),
    ):
        result.append(
            M(f"{stack}mlp.{ours}.weight", f"{layer}mlp.{theirs}.weight", f"{out} {into} -> {into} {out}")
        )
        if config.mlp_bias:
            result.append(M(f"{stack}mlp.{ours}.bias", f"{layer}mlp.{theirs}.bias", f"{out} -> {out}"))
    return result


def _spec(family: str, architecture: str, read: Any, write: Any, rule: KeyRule, **defaults: Any) -> HfFamily:
    return register_hf(
        HfFamily(
            family=family,
            model_type=family,
            architecture=architecture,
            rule=rule,
            required=REQUIRED,
            defaults={**LLAMA_LIKE_DEFAULTS, **defaults},
            read=read,
            write=write,
            mappings=mappings,
        )
    )


LLAMA = _spec(
    "llama", "LlamaForCausalLM", _read_llama, _write_llama,
    LLAMA_LIKE_RULE + KeyRule(implemented=names("attention_bias mlp_bias")),
    max_position_embeddings=2048,
)  # fmt: skip
MISTRAL = _spec(
    "mistral", "MistralForCausalLM", _read_mistral, lambda config: write_uniform_window(config, "MistralForCausalLM"),
    LLAMA_LIKE_RULE, max_position_embeddings=131072, num_key_value_heads=8, sliding_window=4096,
)  # fmt: skip
QWEN2 = _spec(
    "qwen2", "Qwen2ForCausalLM", _read_qwen2, _write_qwen2,
    LLAMA_LIKE_RULE + KeyRule(implemented=names("use_sliding_window max_window_layers")),
    max_position_embeddings=32768, use_sliding_window=False, max_window_layers=28,
)  # fmt: skip
