"""A muP decoder in the style of Mu-Transformer (relative muP, Tensor Programs V appendix B.1).

Hyperparameters tuned at the base width ``d_base`` transfer to any ``hidden_size`` because:

- ``head_dim`` and ``ff_multiple`` stay fixed while the width grows (more heads, wider MLP);
- attention logits are ``q·k * qk_scale`` with ``qk_scale = 1 / head_dim`` (not ``1/sqrt``);
- init: embeddings N(0, 1); hidden matrices N(0, 1/hidden_size) (the MLP output: N(0, 1/d_ff));
  unembedding N(0, 1/hidden_size**2) (std ``1/hidden_size``), or zero; optionally a zero query projection;
- `lr_multipliers`: every hidden matrix and the unembedding train at ``lr * d_base / hidden_size``;
  embeddings, norm gains and biases at ``lr``. The optimizer multiplies its updates by them.

Block: pre-RMSNorm attention (RoPE) and a pre-RMSNorm MLP (``relu`` by default), final RMSNorm before
the unembedding, no biases. `halyard.models.decoder.Decoder.coordinates` reports mean |activation| per
layer for coordinate checks.
"""

from __future__ import annotations

import dataclasses
import math

from halyard.models.config import register_model
from halyard.models.decoder import BlockLayout, DecoderConfig, DecoderShape, LayerKind
from halyard.models.decoder.config import check_activation, check_positive
from halyard.models.rotary import RotaryConfig


@register_model("mup")
@dataclasses.dataclass(frozen=True)
class MupConfig(DecoderConfig):
    """The muP decoder.

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width ``d_model`` (a multiple of ``head_dim``).
        d_base: the width at which hyperparameters were tuned (learning-rate multipliers are relative to it).
        head_dim: fixed size of one head (``num_heads = hidden_size // head_dim``).
        ff_multiple: MLP width as a multiple of ``hidden_size``.
        num_layers: decoder layers.
        max_position: longest configured position (rotary).
        rope: rotary configuration.
        activation: MLP activation (``relu``; ``squared_relu``, ``gelu``, ``silu`` also work).
        norm_eps: RMSNorm epsilon.
        use_gains: learned RMSNorm gains (Mu-Transformer's default has none).
        qk_scale: attention logit scale, None for ``1 / head_dim``.
        zero_query_init: start the query projection at zero (every query attends uniformly at step 0).
        zero_unembed_init: start the unembedding at zero instead of N(0, 1/hidden_size**2).
    """

    vocab_size: int = 32000
    hidden_size: int = 1024
    d_base: int = 128
    head_dim: int = 64
    ff_multiple: int = 4
    num_layers: int = 12
    max_position: int = 2048
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=10000.0))
    activation: str = "relu"
    norm_eps: float = 1e-6
    use_gains: bool = False
    qk_scale: float | None = None
    zero_query_init: bool = True
    zero_unembed_init: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "vocab_size", "hidden_size", "d_base", "head_dim", "ff_multiple", "num_layers")
        if self.hidden_size % self.head_dim != 0:
            raise ValueError(
                f"MupConfig.hidden_size={self.hidden_size} must be a multiple of head_dim={self.head_dim} "
                "(muP keeps the head size fixed and grows the number of heads)"
            )
        self.rope.check_head_size(self.head_dim, f"MupConfig.head_dim={self.head_dim}")
        check_activation(self.activation, "MupConfig.activation")

    @property
    def num_heads(self) -> int:
        """``hidden_size // head_dim``."""
        return self.hidden_size // self.head_dim

    @property
    def mlp_size(self) -> int:
        """``ff_multiple * hidden_size``."""
        return self.ff_multiple * self.hidden_size

    @property
    def width_multiplier(self) -> float:
        """``hidden_size / d_base``: hidden learning rates are divided by it."""
        return self.hidden_size / self.d_base

    @property
    def attention_scale(self) -> float:
        """The attention logit scale in use (``qk_scale`` or ``1 / head_dim``)."""
        return self.qk_scale if self.qk_scale is not None else 1.0 / self.head_dim

    @property
    def shape(self) -> DecoderShape:
        return DecoderShape(
            vocab=self.vocab_size,
            embed=self.hidden_size,
            mlp=self.mlp_size,
            layers=self.num_layers,
            heads=self.num_heads,
            kv_heads=self.num_heads,
            head_size=self.head_dim,
            max_position=self.max_position,
            tie_embeddings=False,
        )

    def layout(self) -> BlockLayout:
        hidden_std = 1.0 / math.sqrt(self.hidden_size)
        return BlockLayout(
            norm_eps=self.norm_eps,
            norm_gains=self.use_gains,
            mlp="plain",
            activation=self.activation,
            attention_scale=self.attention_scale,
            report_coordinates=True,
            init_std=hidden_std,
            mlp_out_init_std=1.0 / math.sqrt(self.mlp_size),
            query_init_std=0.0 if self.zero_query_init else hidden_std,
        )

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return (LayerKind(None, self.rope),) * self.num_layers

    @property
    def embed_init_std(self) -> float:
        return 1.0

    @property
    def lm_head_init_std(self) -> float:
        return 0.0 if self.zero_unembed_init else 1.0 / self.hidden_size
