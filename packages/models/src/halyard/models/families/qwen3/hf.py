"""Qwen3's Hugging Face counterpart, ``Qwen3ForCausalLM``: Qwen2's keys and Llama's tensors, plus the
per-head ``q_norm`` / ``k_norm`` weights (``[head_dim]`` each layer).

Two differences from Qwen2: ``attention_bias`` puts biases on all four projections (Qwen2 has q/k/v
biases only, always), and ``head_dim`` defaults to 128 rather than ``hidden_size // num_attention_heads``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama import hf as llama_hf
from halyard.models.families.qwen3.config import Qwen3Config
from halyard.models.hf import HfFamily, KeyRule, TensorMapping, names, register_hf
from halyard.models.hf.writers import refusal

ARCHITECTURE = "Qwen3ForCausalLM"

# The keys transformers' Qwen3Config and modeling_qwen3.py read (packages/export/tests/test_key_rules.py).
RULE = llama_hf.LLAMA_LIKE_RULE + KeyRule(
    implemented=names("attention_bias use_sliding_window max_window_layers")
)


def read(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """`Qwen3Config` fields of a ``config.json`` (defaults filled in): Qwen2's rule for the windows
    (``sliding_window`` only with ``use_sliding_window``, from layer ``max_window_layers`` on, or
    ``layer_types``), and biases on every projection with ``attention_bias``."""
    used.add("attention_bias")
    return {
        **llama_hf.read_common(hf, used),
        **llama_hf.qwen2_windows(hf, used, architecture=ARCHITECTURE),
        "attention_bias": bool(hf.get("attention_bias", False)),
    }


def write(config: Qwen3Config) -> dict[str, Any]:
    """The ``config.json`` keys of a `Qwen3Config`.

    Raises:
        UnsupportedModelError: MLP biases, or q/k/v biases without the output bias (named).
    """
    if config.mlp_bias:
        raise refusal(config, ARCHITECTURE, "mlp_bias=True", "use the llama family")
    if config.attention_bias and config.qkv_bias_only:
        raise refusal(config, ARCHITECTURE, "q/k/v biases without an output bias", "use the qwen2 family")
    return {
        **llama_hf.write_common(config, ARCHITECTURE),
        "head_dim": config.head_size,  # always written: transformers' default (128) is no derived size
        "attention_bias": config.attention_bias,
        **llama_hf.qwen2_window_keys(config),
    }


def mappings(config: Qwen3Config) -> list[TensorMapping]:
    """Every parameter's tensor: Llama's, then the q/k norms (one ``head_size`` weight each per layer)."""
    M = TensorMapping
    layer, stack = "model.layers.{layers}.self_attn.", "layers.stacked.attention."
    return [
        *llama_hf.mappings(config),
        M(stack + "q_norm.weight", layer + "q_norm.weight", "head_size -> head_size"),
        M(stack + "k_norm.weight", layer + "k_norm.weight", "head_size -> head_size"),
    ]


SPEC = register_hf(
    HfFamily(
        family="qwen3",
        model_type="qwen3",
        architecture=ARCHITECTURE,
        rule=RULE,
        required=llama_hf.REQUIRED,
        defaults={
            **llama_hf.LLAMA_LIKE_DEFAULTS,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "use_sliding_window": False,
            "max_window_layers": 28,
        },
        read=read,
        write=write,
        mappings=mappings,
    )
)
