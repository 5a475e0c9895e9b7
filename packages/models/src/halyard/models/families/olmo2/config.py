"""The OLMo 2 config.

q, k = RMSNorm(x W_q), RMSNorm(x W_k)     # each over the whole projection (heads * head_size)
h = x + RMSNorm(Attention(x))             # RoPE on the normed q and k; no norm before attention
y = h + RMSNorm(SwiGLU(h))                # nor before the MLP
logits = RMSNorm(y_L) · W_out

``attention_bias`` adds biases to all four projections.
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout
from halyard.models.families.llama import LlamaConfig
from halyard.models.rotary import RotaryConfig


@register_model("olmo2")
@dataclasses.dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    """OLMo 2 (defaults: OLMo-2-1124-7B shapes). Every `LlamaConfig` field applies; the block norms come
    after attention and after the MLP instead of before, and the queries and keys are RMS-normalised over
    all heads at once (weights ``(heads, head_size)`` and ``(kv_heads, head_size)``) before rotary."""

    vocab_size: int = 100352  # the other sizes are Llama's (Llama-2 7B's)
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=500000.0))
    rms_norm_eps: float = 1e-6

    def layout(self) -> BlockLayout:
        return dataclasses.replace(
            super().layout(),
            pre_attention_norm=False,
            post_attention_norm=True,
            pre_mlp_norm=False,
            post_mlp_norm=True,
            qk_norm="projection",
        )
