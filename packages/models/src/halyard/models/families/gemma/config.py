"""The Gemma, Gemma 2 and Gemma 3 (text) configs.

Gemma:    x = embed(tokens) * sqrt(hidden_size)
          h = x + Attention(RMSNorm(x));  y = h + GeGLU(RMSNorm(h))     # RMSNorm scales by (1 + w)
Gemma 2:  h = x + RMSNorm(Attention(RMSNorm(x)));  y = h + RMSNorm(GeGLU(RMSNorm(h)))
          attention logits scaled by query_pre_attn_scalar**-0.5 and soft-capped, final logits soft-capped,
          sliding-window and global layers alternating
Gemma 3:  Gemma 2's layer with RMSNorm'd queries and keys (per head), five local layers per global one,
          local layers with their own rotary base; no soft-capping by default

Defaults are transformers' config defaults (`GemmaConfig`: Gemma 7B; `Gemma2Config`: Gemma 2 2B;
`Gemma3TextConfig`: a Gemma 2 2B-sized Gemma 3), so a ``config.json`` that omits a key means the same here.
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout, LayerKind
from halyard.models.decoder.config import check_activation, check_positive
from halyard.models.families.llama.config import LlamaLikeConfig
from halyard.models.rotary import RotaryConfig


@register_model("gemma")
@dataclasses.dataclass(frozen=True)
class GemmaConfig(LlamaLikeConfig):
    """Gemma (defaults: Gemma 7B shapes). Every `LlamaLikeConfig` field applies; for Gemma:

    Attributes:
        hidden_size: model width (``embed``); the embeddings are multiplied by its square root.
        num_kv_heads: key/value heads (as many as num_heads in 7B, MHA; one in 2B, MQA).
        head_dim: size of one head, independent of the width (256 in every Gemma).
        rms_norm_eps: RMSNorm epsilon (every norm multiplies by ``1 + weight``, computed in float32).
        attention_bias: biases on the q/k/v and output projections.
        activation: MLP gate activation (``gelu_pytorch_tanh``: GeGLU with the tanh GELU).
        initializer_range: std of every weight at init (Hugging Face's convention).
    """

    # rope (theta 10000) and attention_bias (False) keep LlamaLikeConfig's defaults
    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_layers: int = 28
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 256
    max_position: int = 8192
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    activation: str = "gelu_pytorch_tanh"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        check_activation(self.activation, f"{type(self).__name__}.activation")

    def layout(self) -> BlockLayout:
        return BlockLayout(
            norm_eps=self.rms_norm_eps,
            norm_offset=1.0,
            qkv_bias=self.attention_bias,
            out_bias=self.attention_bias,
            activation=self.activation,
            init_std=self.initializer_range,
        )

    @property
    def embedding_scale(self) -> float:
        return float(self.hidden_size**0.5)


@register_model("gemma2")
@dataclasses.dataclass(frozen=True)
class Gemma2Config(GemmaConfig):
    """Gemma 2 (defaults: Gemma 2 2B shapes). Every `GemmaConfig` field applies; in addition:

    Attributes:
        query_pre_attn_scalar: attention logits are scaled by ``query_pre_attn_scalar ** -0.5`` (not by
            ``head_dim ** -0.5``).
        attn_logit_softcapping: attention logits become ``cap * tanh(logits / cap)`` (None: no capping).
        final_logit_softcapping: the same on the output logits, in the loss too (None: no capping).
        sliding_window: local layers attend only to the last ``sliding_window`` positions (None: every
            layer attends to every earlier position).
        sliding_window_pattern: every ``sliding_window_pattern``-th layer (the 2nd, 4th, ... for 2) is
            global, the others local; 1 makes every layer global. See `layer_windows`.
    """

    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_layers: int = 26
    num_heads: int = 8
    num_kv_heads: int = 4
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = 50.0
    final_logit_softcapping: float | None = 30.0
    sliding_window: int | None = 4096
    sliding_window_pattern: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "query_pre_attn_scalar", "sliding_window_pattern")
        check_positive(
            self, "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", optional=True
        )

    def layout(self) -> BlockLayout:
        return dataclasses.replace(
            super().layout(),
            post_attention_norm=True,
            post_mlp_norm=True,
            attention_scale=float(self.query_pre_attn_scalar) ** -0.5,
            attention_softcap=self.attn_logit_softcapping,
        )

    def is_global(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is a global layer (Hugging Face's rule: every
        ``sliding_window_pattern``-th); the others are local (windowed when ``sliding_window`` is set)."""
        return (layer + 1) % self.sliding_window_pattern == 0

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: every earlier position), in layer order."""
        return tuple(None if self.is_global(i) else self.sliding_window for i in range(self.num_layers))

    @property
    def final_logit_softcap(self) -> float | None:
        return self.final_logit_softcapping


@register_model("gemma3")
@dataclasses.dataclass(frozen=True)
class Gemma3Config(Gemma2Config):
    """Gemma 3, the text decoder (defaults: transformers' `Gemma3TextConfig`). Every `Gemma2Config` field
    applies; queries and keys are RMSNorm'd per head (``1 + weight``) before rotary. In addition:

    Attributes:
        rope: the global layers' rotary configuration (``rope_theta`` and ``rope_scaling``).
        local_rope: the local (sliding-window) layers' rotary configuration (``rope_local_base_freq``,
            no scaling).

    Soft-capping is off by default, and five local layers precede each global one.
    """

    vocab_size: int = 262208
    max_position: int = 131072
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    local_rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=10000.0))
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window_pattern: int = 6

    def __post_init__(self) -> None:
        super().__post_init__()
        self.local_rope.check_head_size(self.head_dim, f"Gemma3Config.head_dim={self.head_dim}")

    def layout(self) -> BlockLayout:
        return dataclasses.replace(super().layout(), qk_norm="head")

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return tuple(
            LayerKind(None, self.rope)
            if self.is_global(i)
            else LayerKind(self.sliding_window, self.local_rope)
            for i in range(self.num_layers)
        )
