"""Llama, Mistral and Qwen2 configs, and `LlamaLikeConfig`: the sizes they share with Gemma.

h = x + Attention(RMSNorm(x))          # RoPE, grouped-query heads
y = h + SwiGLU(RMSNorm(h))
logits = RMSNorm(y_L) · W_out          # W_out = embedding when tied

Per-layer windows (Qwen2's ``use_sliding_window`` with ``max_window_layers``): the first
``full_attention_layers`` layers attend to every earlier position, the later ones only to the last
``sliding_window`` (`LlamaConfig.layer_kinds`).
"""

from __future__ import annotations

import dataclasses

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout, DecoderConfig, DecoderShape, LayerKind
from halyard.models.decoder.config import check_activation, check_positive
from halyard.models.rotary import RotaryConfig


@dataclasses.dataclass(frozen=True)
class LlamaLikeConfig(DecoderConfig):
    """The sizes every family named as Llama's config names them shares (Llama's and Gemma's lines; defaults:
    Llama-2 7B): the model's `shape`, one rotary setting for every layer and the checks of those sizes.

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width (``embed``).
        intermediate_size: MLP width (``mlp``).
        num_layers: decoder layers.
        num_heads: query heads; num_kv_heads: key/value heads (== num_heads: MHA, 1: MQA, else GQA).
        head_dim: size of one head, independent of the width; None means ``hidden_size // num_heads``.
        max_position: longest sequence the positions are configured for (rotary scaling uses it).
        rope: rotary embedding configuration (theta and scaling: default, linear, dynamic, llama3, yarn,
            longrope).
        rms_norm_eps: RMSNorm epsilon.
        tie_embeddings: share the input embedding with the output projection.
        attention_bias: biases on the attention projections (which ones: the family's `layout`).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int | None = None
    max_position: int = 4096
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=10000.0))
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        check_positive(
            self, "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
            "max_position",
        )  # fmt: skip
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{name}.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim is not None:
            check_positive(self, "head_dim")
            sizes = f"head_dim={self.head_dim}"
        elif self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"{name}.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        else:
            sizes = f"hidden_size={self.hidden_size} / num_heads={self.num_heads}"
        self.rope.check_head_size(self.shape.head_size, f"{name}.{sizes}")

    @property
    def shape(self) -> DecoderShape:
        head_size = self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads
        return DecoderShape(
            vocab=self.vocab_size,
            embed=self.hidden_size,
            mlp=self.intermediate_size,
            layers=self.num_layers,
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            head_size=head_size,
            max_position=self.max_position,
            tie_embeddings=self.tie_embeddings,
        )

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: every earlier position), in layer order."""
        return (None,) * self.num_layers

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return tuple(LayerKind(window, self.rope) for window in self.layer_windows)


@register_model("llama")
@dataclasses.dataclass(frozen=True)
class LlamaConfig(LlamaLikeConfig):
    """A Llama-style decoder (defaults: Llama-2 7B shapes). Every `LlamaLikeConfig` field applies; in addition:

    Attributes:
        attention_bias: biases on q/k/v (and on the output projection unless ``qkv_bias_only``).
        qkv_bias_only: with ``attention_bias``, no bias on the output projection (Qwen2).
        mlp_bias: biases in the MLP.
        sliding_window: attend only to the last ``sliding_window`` positions (Mistral), or None.
        full_attention_layers: with ``sliding_window``, the first this-many layers attend to every earlier
            position and only the later layers use the window (Hugging Face Qwen2's ``max_window_layers``
            when ``use_sliding_window``); 0: every layer uses the window. See `layer_windows`.
        activation: MLP gate activation (``silu`` for SwiGLU).
        initializer_range: std of every weight at init (Hugging Face's convention).
    """

    qkv_bias_only: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    full_attention_layers: int = 0
    activation: str = "silu"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        check_positive(self, "sliding_window", optional=True)
        if self.full_attention_layers:
            if not 0 <= self.full_attention_layers <= self.num_layers:
                raise ValueError(
                    f"{name}.full_attention_layers={self.full_attention_layers} must lie between 0 and "
                    f"num_layers={self.num_layers}"
                )
            if self.sliding_window is None:
                raise ValueError(
                    f"{name}.full_attention_layers={self.full_attention_layers} only applies with a "
                    "sliding_window; set sliding_window or leave full_attention_layers 0"
                )
        check_activation(self.activation, f"{name}.activation")

    def layout(self) -> BlockLayout:
        return BlockLayout(
            norm_eps=self.rms_norm_eps,
            qkv_bias=self.attention_bias,
            out_bias=self.attention_bias and not self.qkv_bias_only,
            mlp_bias=self.mlp_bias,
            activation=self.activation,
            init_std=self.initializer_range,
        )

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: every earlier position), in layer order."""
        return tuple(
            None if index < self.full_attention_layers else self.sliding_window
            for index in range(self.num_layers)
        )


@register_model("mistral")
@dataclasses.dataclass(frozen=True)
class MistralConfig(LlamaConfig):
    """Mistral: the Llama decoder with sliding-window attention (defaults: Mistral 7B v0.1 shapes).

    Every layer attends to the last ``sliding_window`` positions; every `LlamaConfig` field applies.
    """

    intermediate_size: int = 14336
    num_kv_heads: int = 8
    max_position: int = 32768
    sliding_window: int | None = 4096


@register_model("qwen2")
@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """Qwen2: the Llama decoder with q/k/v biases and no output-projection bias (defaults: Qwen2 7B shapes)."""

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_layers: int = 28
    num_heads: int = 28
    num_kv_heads: int = 4
    max_position: int = 32768
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    rms_norm_eps: float = 1e-6
    attention_bias: bool = True
    qkv_bias_only: bool = True
