"""The Phi-3 config (Phi-3, Phi-3.5 and Phi-4-mini checkpoints).

h = x + Attention(RMSNorm(x))          # RoPE (longrope past the pre-training length), grouped-query heads
y = h + SwiGLU(RMSNorm(h))
logits = RMSNorm(y_L) · W_out          # W_out = embedding when tied

The layer is Llama's; what is Phi-3's is how checkpoints store it (q, k and v in one ``qkv_proj``, gate
and up in one ``gate_up_proj``: ``hf.py``), a sliding window on every layer (Phi-3-mini-4k: 2047), a
rotation of only part of each head (Phi-4-mini: ``partial_rotary_factor`` 0.75) and longrope scaling,
whose long factors apply once a batch's longest sequence passes ``rope.original_max_position``.
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.families.llama import LlamaConfig


@register_model("phi3")
@dataclasses.dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    """Phi-3 (defaults: Phi-3-mini-4k-instruct shapes). Every `LlamaConfig` field applies; Hugging Face's
    ``Phi3ForCausalLM`` has no biases and one window for every layer (the export refuses the rest).

    Longrope: ``rope=RotaryConfig(scaling="longrope", short_factor=..., long_factor=...,
    original_max_position=4096, partial_rotary_factor=0.75)`` with ``max_position`` the extended length
    (Phi-4-mini: 131072).
    """

    # num_layers, num_heads and num_kv_heads (32), max_position (4096), rope and rms_norm_eps are Llama's
    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    sliding_window: int | None = 2047
