"""The Qwen3 config.

q, k = RMSNorm_head(x W_q), RMSNorm_head(x W_k)   # one norm over head_size, shared by every head
h = x + Attention(RMSNorm(x))                      # RoPE on the normed q and k, grouped-query heads
y = h + SwiGLU(RMSNorm(h))
logits = RMSNorm(y_L) · W_out                      # W_out = embedding when tied

The head size is its own setting (Qwen3-4B: 32 heads of 128 on a 2560-wide model). ``attention_bias``
adds biases to all four projections (unlike Qwen2's q/k/v only). Per-layer windows work as in Qwen2
(`LlamaConfig.full_attention_layers`).
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout
from halyard.models.families.llama import LlamaConfig
from halyard.models.rotary import RotaryConfig


@register_model("qwen3")
@dataclasses.dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """Qwen3 (defaults: Qwen3-8B shapes). Every `LlamaConfig` field applies; the queries and keys are
    RMS-normalised per head (weights ``(head_size,)``, epsilon ``rms_norm_eps``) before rotary."""

    vocab_size: int = 151936  # hidden_size (4096) and num_heads (32) are Llama's
    intermediate_size: int = 12288
    num_layers: int = 36
    num_kv_heads: int = 8
    head_dim: int | None = 128
    max_position: int = 40960
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    rms_norm_eps: float = 1e-6

    def layout(self) -> BlockLayout:
        return dataclasses.replace(super().layout(), qk_norm="head")
