"""GPT-2's Hugging Face counterpart, ``GPT2LMHeadModel``: its config keys and where its weights live.

``Conv1D`` stores its weights ``[in, out]`` (the Halyard order: no transpose) and packs q, k and v into one
``c_attn`` tensor, split here with ``part``. The oldest checkpoints name the tensors without the
``transformer.`` prefix (``h.0.attn...``) and store per-layer causal-mask buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.gpt2.config import Gpt2Config
from halyard.models.hf import COMMON_RULE, HfFamily, KeyRule, TensorMapping, names, register_hf
from halyard.models.hf.readers import activation_from_hf, renamed
from halyard.models.hf.writers import activation_to_hf

ARCHITECTURE = "GPT2LMHeadModel"

# The keys transformers' GPT2Config and modeling_gpt2.py read (packages/export/tests/test_key_rules.py).
RULE = COMMON_RULE + KeyRule(
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

_FIELDS = {
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


def read(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """`Gpt2Config` fields of a ``config.json`` (defaults filled in)."""
    fields = renamed(hf, used, _FIELDS)
    if "activation" in fields:
        fields["activation"] = activation_from_hf(fields["activation"])
    return fields


def write(config: Gpt2Config) -> dict[str, Any]:
    """The ``config.json`` keys of a `Gpt2Config` (dropout off: Halyard trains without it)."""
    values = {theirs: getattr(config, ours) for theirs, ours in _FIELDS.items()}
    values["activation_function"] = activation_to_hf(config.activation)
    return {
        **values,
        "n_ctx": config.max_position,
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
    }


def mappings(config: Gpt2Config, prefix: str = "transformer.") -> list[TensorMapping]:
    """Every parameter's tensor (``prefix`` is ``""`` in the oldest checkpoints, whose keys start at ``h.0``)."""
    M = TensorMapping
    layer, stack = prefix + "h.{layers}.", "layers.stacked."
    result = [
        M("embed.weight", prefix + "wte.weight", "vocab embed -> vocab embed"),
        M("position_embedding.weight", prefix + "wpe.weight", "position embed -> position embed"),
        M("final_norm.weight", prefix + "ln_f.weight", "embed -> embed"),
        M("final_norm.bias", prefix + "ln_f.bias", "embed -> embed"),
        M(stack + "attention.o_proj.weight", layer + "attn.c_proj.weight",
          "(heads head_size) embed -> heads head_size embed"),
        M(stack + "attention.o_proj.bias", layer + "attn.c_proj.bias", "embed -> embed"),
        M(stack + "mlp.up.weight", layer + "mlp.c_fc.weight", "embed mlp -> embed mlp"),
        M(stack + "mlp.up.bias", layer + "mlp.c_fc.bias", "mlp -> mlp"),
        M(stack + "mlp.down.weight", layer + "mlp.c_proj.weight", "mlp embed -> mlp embed"),
        M(stack + "mlp.down.bias", layer + "mlp.c_proj.bias", "embed -> embed"),
    ]  # fmt: skip
    for ours, theirs in (("attention_norm", "ln_1"), ("mlp_norm", "ln_2")):
        for field in ("weight", "bias"):
            result.append(M(f"{stack}{ours}.{field}", f"{layer}{theirs}.{field}", "embed -> embed"))
    for index, (name, heads) in enumerate(
        (("q_proj", "heads"), ("k_proj", "kv_heads"), ("v_proj", "kv_heads"))
    ):
        part = ("qkv", index, 3)
        result.append(
            M(f"{stack}attention.{name}.weight", layer + "attn.c_attn.weight",
              f"embed (qkv {heads} head_size) -> embed {heads} head_size", part)
        )  # fmt: skip
        result.append(
            M(f"{stack}attention.{name}.bias", layer + "attn.c_attn.bias",
              f"(qkv {heads} head_size) -> {heads} head_size", part)
        )  # fmt: skip
    return result


SPEC = register_hf(
    HfFamily(
        family="gpt2",
        model_type="gpt2",
        architecture=ARCHITECTURE,
        rule=RULE,
        required=("vocab_size", "n_embd", "n_layer", "n_head"),
        defaults={
            "n_inner": None,
            "n_positions": 1024,
            "layer_norm_epsilon": 1e-5,
            "activation_function": "gelu_new",
        },
        read=read,
        write=write,
        mappings=mappings,
        legacy_mappings=lambda config: [mappings(config, prefix="")],
        buffers=("attn.bias", "attn.masked_bias"),
    )
)
