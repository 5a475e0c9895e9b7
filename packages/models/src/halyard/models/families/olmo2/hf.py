"""OLMo 2's Hugging Face counterpart, ``Olmo2ForCausalLM``: Llama's keys and projections, its two norms
after attention and after the MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``) and
``q_norm`` / ``k_norm`` over the whole projections (``[heads * head_dim]`` and ``[kv_heads * head_dim]``).

transformers' ``Olmo2Config`` has no ``head_dim`` field, but its attention reads one when the config
holds it (``getattr(config, "head_dim", hidden_size // num_attention_heads)``): Halyard reads and writes it
the same way. ``attention_bias`` puts biases on all four projections; the MLP never has any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halyard.models.families.llama import hf as llama_hf
from halyard.models.families.olmo2.config import Olmo2Config
from halyard.models.hf import KeyRule, UnsupportedModelError, names
from halyard.models.hf.readers import layer_windows
from halyard.models.hf.writers import refusal

ARCHITECTURE = "Olmo2ForCausalLM"

# The keys transformers' Olmo2Config and modeling_olmo2.py read (packages/export/tests/test_key_rules.py);
# sliding_window and layer_types reach it through the shared mask builders only.
RULE = llama_hf.LLAMA_LIKE_RULE + KeyRule(implemented=names("attention_bias"))


def read(hf: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """`Olmo2Config` fields of a ``config.json`` (defaults filled in).

    Raises:
        UnsupportedModelError: a ``sliding_window`` or sliding ``layer_types`` (OLMo 2 attends to every
            earlier position).
    """
    fields = llama_hf.read_common(hf, used)
    used.update({"sliding_window", "attention_bias"})
    if hf.get("sliding_window") is not None:
        raise UnsupportedModelError(
            f"sliding_window={hf['sliding_window']} is not an option of {ARCHITECTURE}"
        )
    layer_windows(hf, used, window=None, num_layers=fields["num_layers"])  # refuses sliding layer types
    return {**fields, "attention_bias": bool(hf.get("attention_bias", False))}


def write(config: Olmo2Config) -> dict[str, Any]:
    """The ``config.json`` keys of an `Olmo2Config`.

    Raises:
        UnsupportedModelError: a sliding window, MLP biases, or q/k/v biases without the output bias (named).
    """
    if config.sliding_window is not None:
        raise refusal(
            config, ARCHITECTURE, f"sliding_window={config.sliding_window}", "use the mistral family"
        )
    if config.mlp_bias:
        raise refusal(config, ARCHITECTURE, "mlp_bias=True", "use the llama family")
    if config.attention_bias and config.qkv_bias_only:
        raise refusal(config, ARCHITECTURE, "q/k/v biases without an output bias", "use the qwen2 family")
    return {**llama_hf.write_common(config, ARCHITECTURE), "attention_bias": config.attention_bias}


SPEC = llama_hf.register_llama_like(
    "olmo2", ARCHITECTURE, read=read, write=write, rule=RULE, rms_norm_eps=1e-5, max_position_embeddings=2048
)
