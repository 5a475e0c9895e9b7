"""Phi-3's Hugging Face counterpart, ``Phi3ForCausalLM`` (model_type ``phi3``): its config keys and where its
weights live.

Checkpoints fuse projections that Halyard keeps apart: ``self_attn.qkv_proj.weight`` holds the q, k and v
rows one after the other (q longer than k and v with grouped-query heads) and ``mlp.gate_up_proj.weight``
the gate rows, then the up rows; each Halyard parameter is its ``part`` of them (`TensorMapping`). The
rotary setting is ``rope_scaling`` (which wins over ``rope_parameters``, as in transformers' Phi3Config),
with the pre-training length at the top level: ``original_max_position_embeddings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama.hf import (
    LLAMA_LIKE_RULE,
    read_common,
    register_llama_like,
    uniform_window,
    write_common,
)
from halyard.models.families.llama.hf import mappings as llama_like_mappings
from halyard.models.families.phi3.config import Phi3Config
from halyard.models.hf import KeyRule, TensorMapping, UnsupportedModelError, names
from halyard.models.hf.writers import refusal

ARCHITECTURE = "Phi3ForCausalLM"

# The keys transformers' Phi3Config and modeling_phi3.py read (packages/export/tests/test_key_rules.py).
RULE = LLAMA_LIKE_RULE + KeyRule(
    implemented=names("original_max_position_embeddings"),
    fixed={
        # Not read by transformers' Phi3 (written by the checkpoints' own remote code): other values mean
        # weights (biases) or a layer pattern Phi3ForCausalLM does not have.
        "attention_bias": (False, None),
        "mlp_bias": (False, None),
        "lm_head_bias": (False, None),
        "full_attn_mod": (1, None),
        "interpolate_factor": (1, None),
    },
    no_effect=names("resid_pdrop embd_pdrop"),  # dropout: Halyard trains without it
)
ROPE_TYPES = ("default", "longrope")
# Phi3Config reads these rope types of older checkpoints as longrope.
LEGACY_LONGROPE = ("su", "yarn")


def _rope_settings(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    """``hf`` with its rotary dict as Phi3Config reads it: ``rope_scaling`` before ``rope_parameters``, and
    the legacy types ``su`` and ``yarn`` as ``longrope``.

    Raises:
        UnsupportedModelError: a rope type other than default and longrope (Phi3Config refuses them).
    """
    parameters = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not parameters:
        return hf
    parameters = dict(parameters)
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind in LEGACY_LONGROPE:
        kind = parameters["rope_type"] = "longrope"
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {kind!r}: {ARCHITECTURE} implements {ROPE_TYPES} (and reads {LEGACY_LONGROPE} as longrope)"
        )
    return {**hf, "rope_parameters": parameters, "rope_scaling": None}


def read(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """`Phi3Config` fields of a ``config.json`` (defaults filled in)."""
    fields = read_common(_rope_settings(hf), used, partial=True, original_max_position=True)
    fields["sliding_window"] = uniform_window(hf, used, ARCHITECTURE)
    return fields


def write(config: Phi3Config) -> dict[str, Any]:
    """The ``config.json`` keys of a `Phi3Config`.

    Raises:
        UnsupportedModelError: biases, a window on only some layers, a rope type other than default and
            longrope, or longrope with a ``head_dim`` other than ``hidden_size / num_heads`` (transformers
            checks the factors' length against ``hidden_size / num_attention_heads``).
    """
    for option, value in (("attention_bias", config.attention_bias), ("mlp_bias", config.mlp_bias)):
        if value:
            raise refusal(config, ARCHITECTURE, f"{option}=True", "Phi-3 has no biases: use the llama family")
    if config.full_attention_layers:
        what = f"full_attention_layers={config.full_attention_layers} (a window on only some layers)"
        raise refusal(config, ARCHITECTURE, what, "use the qwen2 family")
    if config.rope.scaling not in ROPE_TYPES:
        what = f"rope.scaling={config.rope.scaling!r}"
        raise refusal(config, ARCHITECTURE, what, f"use one of {ROPE_TYPES}")
    explicit_head = config.head_dim not in (None, config.hidden_size // config.num_heads)
    if config.rope.scaling == "longrope" and explicit_head:
        what = f"head_dim={config.head_dim} (not hidden_size / num_heads) with longrope"
        raise refusal(config, ARCHITECTURE, what, "leave head_dim None")
    return {
        **write_common(config, ARCHITECTURE, partial=True),
        "sliding_window": config.sliding_window,
        # Phi3Config takes the pre-training length from here (default 4096), not from rope_scaling.
        "original_max_position_embeddings": config.rope.original_max_position or config.max_position,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    }


def mappings(config: Phi3Config) -> list[TensorMapping]:
    """Every parameter's tensor: Llama's, with q/k/v parts of ``qkv_proj`` and gate/up parts of
    ``gate_up_proj``."""
    M = TensorMapping
    layer, stack = "model.layers.{layers}.", "layers.stacked."
    qkv_rows = (config.num_heads, config.num_kv_heads, config.num_kv_heads)  # heads of head_size rows
    fused = {}
    for index, (name, heads) in enumerate(
        (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads"))
    ):
        path = f"{stack}attention.{name}.weight"
        fused[path] = M(
            path, layer + "self_attn.qkv_proj.weight",
            f"(qkv {heads} head_size) embed -> embed {heads} head_size", ("qkv", index, qkv_rows),
        )  # fmt: skip
    for index, name in enumerate(("gate", "up")):  # sized parts: a slice of mlp reads only its rows
        path = f"{stack}mlp.{name}.weight"
        fused[path] = M(
            path, layer + "mlp.gate_up_proj.weight",
            "(gate_up mlp) embed -> embed mlp", ("gate_up", index, (config.intermediate_size,) * 2),
        )  # fmt: skip
    return [fused.get(mapping.path, mapping) for mapping in llama_like_mappings(config)]


# transformers' Phi3Config defaults for keys a config.json may omit, where they are not Llama's.
SPEC = register_llama_like(
    "phi3", ARCHITECTURE, read=read, write=write, rule=RULE, mappings=mappings,
    max_position_embeddings=4096, original_max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-5,
)  # fmt: skip
