"""The Hugging Face counterparts of Llama, Mistral and Qwen2 (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``): their config keys and where their weights live. The three share one layer, one
tensor layout and most keys; they differ in biases and in which layers use a sliding window.

``nn.Linear`` stores ``[out, in]``; Halyard's `Linear` stores ``(in..., out...)``, so projections transpose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from halyard.models.decoder import BlockLayout, DecoderConfig
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
from halyard.models.hf.spec import Reader
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


def _norms(layout: BlockLayout) -> dict[str, str]:
    """The layout's norms and their Hugging Face names: ``post_attention_layernorm`` is the norm after
    attention where the layer has one (Gemma 2, OLMo 2), else the norm before the MLP (Llama, Gemma)."""
    names = {
        "attention_norm": (layout.pre_attention_norm, "input_layernorm"),
        "post_attention_norm": (layout.post_attention_norm, "post_attention_layernorm"),
        "mlp_norm": (
            layout.pre_mlp_norm,
            "pre_feedforward_layernorm" if layout.post_attention_norm else "post_attention_layernorm",
        ),
        "post_mlp_norm": (layout.post_mlp_norm, "post_feedforward_layernorm"),
    }
    return {ours: theirs for ours, (present, theirs) in names.items() if present}


def mappings(config: DecoderConfig) -> list[TensorMapping]:
    """Every parameter's tensor as the Llama-like architectures store it, from the config's `layout`: the
    embeddings, the layer's norms, q/k/v/o with their biases, the head unless tied, the gated MLP (a
    ``moe`` layout's experts are the family's to add) and the q/k norms."""
    M = TensorMapping
    layout = config.layout()
    layer, stack = "model.layers.{layers}.", "layers.stacked."
    attention = layer + "self_attn."
    projections = (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads"))
    result = [
        M("embed.weight", "model.embed_tokens.weight", "vocab embed -> vocab embed"),
        M("final_norm.weight", "model.norm.weight", "embed -> embed"),
        *(M(f"{stack}{ours}.weight", f"{layer}{theirs}.weight", "embed -> embed")
          for ours, theirs in _norms(layout).items()),
        *(M(f"{stack}attention.{name}.weight", f"{attention}{name}.weight",
            f"({heads} head_size) embed -> embed {heads} head_size") for name, heads in projections),
        M(stack + "attention.o_proj.weight", attention + "o_proj.weight",
          "embed (heads head_size) -> heads head_size embed"),
    ]  # fmt: skip
    if not config.shape.tie_embeddings:
        result.append(M("lm_head.weight", "lm_head.weight", "vocab embed -> embed vocab"))
    if layout.qkv_bias:
        for name, heads in projections:
            result.append(
                M(f"{stack}attention.{name}.bias", f"{attention}{name}.bias",
                  f"({heads} head_size) -> {heads} head_size")
            )  # fmt: skip
    if layout.out_bias:
        result.append(M(stack + "attention.o_proj.bias", attention + "o_proj.bias", "embed -> embed"))
    if layout.mlp != "moe":
        for ours, theirs, into, out in (
            ("gate", "gate_proj", "embed", "mlp"),
            ("up", "up_proj", "embed", "mlp"),
            ("down", "down_proj", "mlp", "embed"),
        ):
            result.append(
                M(f"{stack}mlp.{ours}.weight", f"{layer}mlp.{theirs}.weight", f"{out} {into} -> {into} {out}")
            )
            if layout.mlp_bias:
                result.append(M(f"{stack}mlp.{ours}.bias", f"{layer}mlp.{theirs}.bias", f"{out} -> {out}"))
    if layout.qk_norm is not None:
        for name, heads in (("q_norm", "heads"), ("k_norm", "kv_heads")):
            axes = "head_size" if layout.qk_norm == "head" else f"{heads} head_size"
            hf_axes = "head_size" if layout.qk_norm == "head" else f"({heads} head_size)"
            result.append(
                M(f"{stack}attention.{name}.weight", f"{attention}{name}.weight", f"{hf_axes} -> {axes}")
            )
    return result


def register_llama_like(
    family: str,
    architecture: str,
    *,
    read: Reader,
    write: Callable[[Any], dict[str, Any]],
    rule: KeyRule,
    mappings: Callable[[Any], list[TensorMapping]] = mappings,
    **defaults: Any,
) -> HfFamily:
    """Register the spec of a Llama-like architecture: model_type ``family``, the `REQUIRED` keys and
    transformers' `LLAMA_LIKE_DEFAULTS` with ``defaults`` (config.json key -> value) on top."""
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


LLAMA = register_llama_like(
    "llama", "LlamaForCausalLM", read=_read_llama, write=_write_llama,
    rule=LLAMA_LIKE_RULE + KeyRule(implemented=names("attention_bias mlp_bias")), max_position_embeddings=2048,
)  # fmt: skip
MISTRAL = register_llama_like(
    "mistral", "MistralForCausalLM", read=_read_mistral,
    write=lambda config: write_uniform_window(config, "MistralForCausalLM"),
    rule=LLAMA_LIKE_RULE, max_position_embeddings=131072, num_key_value_heads=8, sliding_window=4096,
)  # fmt: skip
QWEN2 = register_llama_like(
    "qwen2", "Qwen2ForCausalLM", read=_read_qwen2, write=_write_qwen2,
    rule=LLAMA_LIKE_RULE + KeyRule(implemented=names("use_sliding_window max_window_layers")),
    max_position_embeddings=32768, use_sliding_window=False, max_window_layers=28,
)  # fmt: skip
