"""`DecoderSpec`: what every decoder family tells the one skeleton, as `Decoder` and `DecoderBlock` read it.

A family's config answers four questions: the model's sizes (`shape`), how a layer is arranged (`layout`),
what differs per layer (`layer_kinds`), and the few hooks where a family's embedding or output differ
(`embedding_scale`, `final_logit_softcap`). `DecoderConfig` (config.py), which families derive from, adds
what follows from the answers; it sits above the skeleton (it builds a `Decoder`), this module below it.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import NamedTuple

from halyard.models.config import ModelConfig
from halyard.models.decoder.layout import BlockLayout, LayerKind
from halyard.named.nn import DotGeneral, int8_dot_general


class DecoderShape(NamedTuple):
    """The sizes of a decoder.

    Attributes:
        vocab, embed, mlp, layers: vocabulary, width, MLP width and depth.
        heads, kv_heads, head_size: query heads, key/value heads, size of one head.
        max_position: the longest position configured (learned tables, rotary scaling).
        tie_embeddings: the output projection is the input embedding.
        learned_positions: a learned ``(position, embed)`` table is added to the embeddings (GPT-2).
    """

    vocab: int
    embed: int
    mlp: int
    layers: int
    heads: int
    kv_heads: int
    head_size: int
    max_position: int
    tie_embeddings: bool
    learned_positions: bool = False


QUANTIZATIONS = ("none", "int8")


@dataclasses.dataclass(frozen=True)
class DecoderSpec(ModelConfig):
    """The questions every decoder family's config answers, as the skeleton reads them (`DecoderConfig`
    derives from it and adds what follows: building the model, parameter and FLOP counts).

    Attributes:
        quantization: ``none`` or ``int8``: the layers' projections (attention q/k/v/o, the MLP) run as
            int8 x int8 -> int32 matmuls in the forward pass and both gradient products, the input scaled
            per token and the weight per output channel (`halyard.named.nn.int8_dot_general`); weights,
            optimizer state, the embedding, attention itself, the output head and the loss stay in their
            dtypes. Twice the bf16 matmul rate on a TPU v5e; refused for MoE experts (``ragged_dot``).
    """

    quantization: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"model.quantization={self.quantization} ({name}): choose one of {', '.join(QUANTIZATIONS)}"
            )
        if self.quantization == "int8" and self.layout().mlp == "moe":
            raise ValueError(
                f"model.quantization=int8 ({name}): the MoE experts' matmuls (ragged_dot) cannot be "
                f"quantized; train {self.family} with model.quantization none"
            )

    def projection_dot_general(self) -> DotGeneral | None:
        """The contraction of the layers' projections: `int8_dot_general` with ``quantization: int8``,
        else None (`Linear`'s default)."""
        return int8_dot_general if self.quantization == "int8" else None

    @property
    @abc.abstractmethod
    def shape(self) -> DecoderShape:
        """The model's sizes."""

    @abc.abstractmethod
    def layout(self) -> BlockLayout:
        """How every layer is arranged (the same for all layers)."""

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Each layer's attention window and rotary setting, in layer order (default: none, learned positions)."""
        return (LayerKind(None, None),) * self.shape.layers

    @property
    def embedding_scale(self) -> float:
        """Multiplier on the token embeddings (Gemma: sqrt(hidden_size)); 1.0 for most families."""
        return 1.0

    @property
    def final_logit_softcap(self) -> float | None:
        """``cap * tanh(logits / cap)`` on the output logits (Gemma 2), or None."""
        return None

    def router_loss_weights(self) -> tuple[float, float]:
        """Weights of the MoE load-balancing loss and router z-loss in the training loss (dense: zeros)."""
        return (0.0, 0.0)

    @property
    def embed_init_std(self) -> float:
        """Std of the token (and position) embeddings at init."""
        return self.layout().init_std

    @property
    def lm_head_init_std(self) -> float:
        """Std of an untied output projection at init."""
        return self.layout().init_std

    @property
    def head_size(self) -> int:
        """Size of one attention head."""
        return self.shape.head_size

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.shape.kv_heads
