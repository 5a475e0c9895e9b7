"""Qwen3's Hugging Face counterpart, ``Qwen3ForCausalLM``: Qwen2's keys and Llama's tensors, with the
per-head ``q_norm`` / ``k_norm`` weights (``[head_dim]`` each layer) that `llama_hf.mappings` adds for its
``qk_norm="head"`` layout.

Two differences from Qwen2: ``attention_bias`` puts biases on all four projections (Qwen2 has q/k/v
biases only, always), and ``head_dim`` defaults to 128 rather than ``hidden_size // num_attention_heads``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama import hf as llama_hf
from halyard.models.families.qwen3.config import Qwen3Config
from halyard.models.hf import KeyRule, names
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


SPEC = llama_hf.register_llama_like(
    "qwen3", ARCHITECTURE, read=read, write=write, rule=RULE,
    head_dim=128, max_position_embeddings=32768, use_sliding_window=False, max_window_layers=28,
)  # fmt: skip
