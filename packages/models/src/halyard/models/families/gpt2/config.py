"""The GPT-2 config.

x = wte[tokens] + wpe[positions]
h = x + Attention(LayerNorm(x))
y = h + MLP(LayerNorm(h))
logits = LayerNorm(y_L) · wte
"""

from __future__ import annotations

import dataclasses
import math

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout, DecoderConfig, DecoderShape
from halyard.models.decoder.config import check_activation, check_positive


@register_model("gpt2")
@dataclasses.dataclass(frozen=True)
class Gpt2Config(DecoderConfig):
    """GPT-2 (defaults: the 124M model).

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width (``embed``); num_heads divides it.
        num_layers: decoder layers.
        num_heads: attention heads (head size ``hidden_size // num_heads``).
        intermediate_size: MLP width; None means ``4 * hidden_size``.
        max_position: number of learned positions.
        layer_norm_eps: LayerNorm epsilon.
        activation: MLP activation (``gelu_new``, the tanh approximation).
        initializer_range: weight std at init; residual projections use it / sqrt(2 * num_layers).
    """

    vocab_size: int = 50257
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int | None = None
    max_position: int = 1024
    layer_norm_eps: float = 1e-5
    activation: str = "gelu_new"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "vocab_size", "hidden_size", "num_layers", "num_heads", "max_position")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"Gpt2Config.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        check_activation(self.activation, "Gpt2Config.activation")

    @property
    def shape(self) -> DecoderShape:
        return DecoderShape(
            vocab=self.vocab_size,
            embed=self.hidden_size,
            mlp=self.intermediate_size if self.intermediate_size is not None else 4 * self.hidden_size,
            layers=self.num_layers,
            heads=self.num_heads,
            kv_heads=self.num_heads,
            head_size=self.hidden_size // self.num_heads,
            max_position=self.max_position,
            tie_embeddings=True,
            learned_positions=True,
        )

    def layout(self) -> BlockLayout:
        residual_std = self.initializer_range / math.sqrt(2 * self.num_layers)
        return BlockLayout(
            norm="layer",
            norm_eps=self.layer_norm_eps,
            qkv_bias=True,
            out_bias=True,
            mlp="plain",
            mlp_bias=True,
            activation=self.activation,
            init_std=self.initializer_range,
            out_init_std=residual_std,
            mlp_out_init_std=residual_std,
        )
