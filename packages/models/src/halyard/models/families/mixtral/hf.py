"""Mixtral's Hugging Face counterpart, ``MixtralForCausalLM``: Mistral's keys and tensors plus the experts.

The experts are stored as transformers saves them, one tensor per expert and layer:
``block_sparse_moe.experts.{j}.w1`` (gate), ``w3`` (up), ``w2`` (down) and the router ``block_sparse_moe.gate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama import hf as llama_hf
from halyard.models.families.mixtral.config import MixtralConfig
from halyard.models.hf import KeyRule, TensorMapping, names
from halyard.models.hf.readers import renamed

ARCHITECTURE = "MixtralForCausalLM"

RULE = llama_hf.LLAMA_LIKE_RULE + KeyRule(
    implemented=names("num_local_experts num_experts_per_tok router_aux_loss_coef"),
    no_effect=names("output_router_logits router_jitter_noise"),  # training-time only
    aliases={"num_experts": "num_local_experts"},
)
_EXPERT_FIELDS = {
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_token",
    "router_aux_loss_coef": "router_aux_loss_coef",
}


def read(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """`MixtralConfig` fields of a ``config.json`` (defaults filled in)."""
    fields = llama_hf.read_common(hf, used)
    fields["sliding_window"] = llama_hf.uniform_window(hf, used, ARCHITECTURE)
    return {**fields, **renamed(hf, used, _EXPERT_FIELDS)}


def write(config: MixtralConfig) -> dict[str, Any]:
    """The ``config.json`` keys of a `MixtralConfig`."""
    return {
        **llama_hf.write_uniform_window(config, ARCHITECTURE),
        **{theirs: getattr(config, ours) for theirs, ours in _EXPERT_FIELDS.items()},
        "output_router_logits": False,
        "router_jitter_noise": 0.0,
    }


def mappings(config: MixtralConfig) -> list[TensorMapping]:
    """Every parameter's tensor: Llama's attention and norms, then the router and the experts."""
    M = TensorMapping
    moe, layer = "layers.stacked.mlp.", "model.layers.{layers}.block_sparse_moe."
    expert = layer + "experts.{experts}."
    return [
        *llama_hf.mappings(config),
        M(moe + "router.weight", layer + "gate.weight", "experts embed -> embed experts"),
        M(moe + "gate", expert + "w1.weight", "mlp embed -> embed mlp"),
        M(moe + "up", expert + "w3.weight", "mlp embed -> embed mlp"),
        M(moe + "down", expert + "w2.weight", "embed mlp -> mlp embed"),
    ]


SPEC = llama_hf.register_llama_like(
    "mixtral", ARCHITECTURE, read=read, write=write, rule=RULE, mappings=mappings,
    rms_norm_eps=1e-5, max_position_embeddings=131072, num_key_value_heads=8, rope_theta=1e6,
    num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.001,
)  # fmt: skip
