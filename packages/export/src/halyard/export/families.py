"""Where each Halyard parameter lives in a Hugging Face checkpoint, per model family.

Hugging Face ``nn.Linear`` stores ``[out, in]``; Halyard's `Linear` stores ``(in..., out...)``, so Llama-style
projections transpose. GPT-2's ``Conv1D`` already stores ``[in, out]`` (no transpose) and packs q, k and
v into one ``c_attn`` tensor. Stacked layers map to ``...layers.{i}...`` tensors.
"""

from __future__ import annotations

from halyard.export.errors import UnsupportedModelError
from halyard.export.tensor_mapping import TensorMapping as M
from halyard.models import Gpt2Config, LlamaConfig, MixtralConfig, ModelConfig

# The Hugging Face model_type and architecture of each Halyard family that has one.
HF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "gpt2": ("gpt2", "GPT2LMHeadModel"),
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "mixtral": ("mixtral", "MixtralForCausalLM"),
}

GPT2_BUFFERS = ("attn.bias", "attn.masked_bias")
"""Per-layer causal-mask buffers older GPT-2 checkpoints store; constants, not parameters."""


def gpt2_mappings(prefix: str = "transformer.") -> list[M]:
    """GPT-2 (``prefix`` is ``""`` in the oldest checkpoints, whose keys start at ``h.0``)."""
    layer = prefix + "h.{layers}."
    stack = "layers.layers."
    mappings = [
        M("token_embedding.weight", prefix + "wte.weight", "vocab embed -> vocab embed"),
        M("position_embedding.weight", prefix + "wpe.weight", "position embed -> position embed"),
        M("ln_f.weight", prefix + "ln_f.weight", "embed -> embed"),
        M("ln_f.bias", prefix + "ln_f.bias", "embed -> embed"),
        M(stack + "attention.o_proj.weight", layer + "attn.c_proj.weight",
          "(heads head_size) embed -> heads head_size embed"),
        M(stack + "attention.o_proj.bias", layer + "attn.c_proj.bias", "embed -> embed"),
        M(stack + "mlp.up.weight", layer + "mlp.c_fc.weight", "embed mlp -> embed mlp"),
        M(stack + "mlp.up.bias", layer + "mlp.c_fc.bias", "mlp -> mlp"),
        M(stack + "mlp.down.weight", layer + "mlp.c_proj.weight", "mlp embed -> mlp embed"),
        M(stack + "mlp.down.bias", layer + "mlp.c_proj.bias", "embed -> embed"),
    ]  # fmt: skip
    for norm in ("ln_1", "ln_2"):
        for field in ("weight", "bias"):
            mappings.append(M(f"{stack}{norm}.{field}", f"{layer}{norm}.{field}", "embed -> embed"))
    for index, (name, heads) in enumerate(
        (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads"))
    ):
        part = ("qkv", index, 3)
        mappings.append(
            M(f"{stack}attention.{name}.weight", layer + "attn.c_attn.weight",
              f"embed (qkv {heads} head_size) -> embed {heads} head_size", part)
        )  # fmt: skip
        mappings.append(
            M(f"{stack}attention.{name}.bias", layer + "attn.c_attn.bias",
              f"(qkv {heads} head_size) -> {heads} head_size", part)
        )  # fmt: skip
    return mappings


def llama_mappings(config: LlamaConfig) -> list[M]:
    """Llama, Mistral, Qwen2 and (with `MixtralConfig`) Mixtral."""
    layer = "model.layers.{layers}."
    stack = "layers.layers."
    mappings = [
        M("embed.weight", "model.embed_tokens.weight", "vocab embed -> vocab embed"),
        M("norm.weight", "model.norm.weight", "embed -> embed"),
        M(stack + "input_norm.weight", layer + "input_layernorm.weight", "embed -> embed"),
        M(stack + "post_attention_norm.weight", layer + "post_attention_layernorm.weight", "embed -> embed"),
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
        mappings.append(M("lm_head.weight", "lm_head.weight", "vocab embed -> embed vocab"))
    if config.attention_bias:
        for name, heads in (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads")):
            mappings.append(
                M(f"{stack}attention.{name}.bias", f"{layer}self_attn.{name}.bias",
                  f"({heads} head_size) -> {heads} head_size")
            )  # fmt: skip
        if not config.qkv_bias_only:
            mappings.append(
                M(stack + "attention.o_proj.bias", layer + "self_attn.o_proj.bias", "embed -> embed")
            )
    if isinstance(config, MixtralConfig):
        moe, expert = stack + "moe.", layer + "block_sparse_moe.experts.{experts}."
        mappings += [
            M(
                moe + "router.weight",
                layer + "block_sparse_moe.gate.weight",
                "experts embed -> embed experts",
            ),
            M(moe + "gate", expert + "w1.weight", "mlp embed -> embed mlp"),
            M(moe + "up", expert + "w3.weight", "mlp embed -> embed mlp"),
            M(moe + "down", expert + "w2.weight", "embed mlp -> mlp embed"),
        ]
        return mappings
    mappings += [
        M(stack + "mlp.gate.weight", layer + "mlp.gate_proj.weight", "mlp embed -> embed mlp"),
        M(stack + "mlp.up.weight", layer + "mlp.up_proj.weight", "mlp embed -> embed mlp"),
        M(stack + "mlp.down.weight", layer + "mlp.down_proj.weight", "embed mlp -> mlp embed"),
    ]
    if config.mlp_bias:
        mappings += [
            M(stack + "mlp.gate.bias", layer + "mlp.gate_proj.bias", "mlp -> mlp"),
            M(stack + "mlp.up.bias", layer + "mlp.up_proj.bias", "mlp -> mlp"),
            M(stack + "mlp.down.bias", layer + "mlp.down_proj.bias", "embed -> embed"),
        ]
    return mappings


def mappings_for(config: ModelConfig, *, gpt2_prefix: str = "transformer.") -> list[M]:
    """Every parameter's mapping for a Halyard config.

    Raises:
        UnsupportedModelError: the family has no Hugging Face counterpart (e.g. ``mup``).
    """
    if isinstance(config, Gpt2Config):
        return gpt2_mappings(gpt2_prefix)
    if isinstance(config, LlamaConfig) and config.family in HF_ARCHITECTURES:
        return llama_mappings(config)
    raise UnsupportedModelError(
        f"Halyard family {config.family!r} has no Hugging Face architecture to convert to or from; "
        f"supported: {', '.join(sorted(HF_ARCHITECTURES))}"
    )
