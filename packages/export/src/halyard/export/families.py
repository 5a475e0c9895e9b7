"""Where each Halyard parameter lives in a Hugging Face checkpoint, per model family.

Hugging Face ``nn.Linear`` stores ``[out, in]``; Halyard's `Linear` stores ``(in..., out...)``, so Llama-style
projections transpose. GPT-2's ``Conv1D`` already stores ``[in, out]`` (no transpose) and packs q, k and
v into one ``c_attn`` tensor. Stacked layers map to ``...layers.{i}...`` tensors.
"""

from __future__ import annotations

from halyard.export.errors import UnsupportedModelError
from halyard.export.key_rule import COMMON_RULE, KeyRule, names
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

# The key rule of each family (see `halyard.export.key_rule`), from the keys that transformers'
# GPT2Config / LlamaConfig / MistralConfig / Qwen2Config / MixtralConfig and their modeling_*.py read
# (checked against the installed transformers by tests/test_key_rules.py).
GPT2_RULE = COMMON_RULE + KeyRule(
    implemented=names(
        "vocab_size n_embd n_layer n_head n_inner n_positions layer_norm_epsilon",
        "activation_function initializer_range",
    ),
    fixed={
        "tie_word_embeddings": (True,),  # Halyard's GPT-2 always shares the embedding with the output
        "scale_attn_weights": (True,),
        "scale_attn_by_inverse_layer_idx": (False,),
        # read by generate's mask builder (static caches); GPT-2 attends to every earlier position
        "sliding_window": (None,),
        "layer_types": (None,),
    },
    # dropout, heads other than the LM head; reorder_and_upcast_attn only changes fp16 rounding
    no_effect=names(
        "classifier_dropout hidden_dropout summary_last_dropout",
        "attn_pdrop embd_pdrop resid_pdrop reorder_and_upcast_attn n_ctx summary_type",
        "summary_use_proj summary_activation summary_proj_to_labels summary_first_dropout",
    ),
    aliases={
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
)
_LLAMA_LIKE_RULE = COMMON_RULE + KeyRule(
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
KEY_RULES: dict[str, KeyRule] = {
    "gpt2": GPT2_RULE,
    "llama": _LLAMA_LIKE_RULE + KeyRule(implemented=names("attention_bias mlp_bias")),
    "mistral": _LLAMA_LIKE_RULE,
    "qwen2": _LLAMA_LIKE_RULE + KeyRule(implemented=names("use_sliding_window max_window_layers")),
    "mixtral": _LLAMA_LIKE_RULE
    + KeyRule(
        implemented=names("num_local_experts num_experts_per_tok router_aux_loss_coef"),
        no_effect=names("output_router_logits router_jitter_noise"),  # training-time only
        aliases={"num_experts": "num_local_experts"},
    ),
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
