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


@dataclasses.dataclass(frozen=True)
class DecoderSpec(ModelConfig):
    """The questions every decoder family's config answers, as the skeleton reads them (`DecoderConfig`
    derives from it and adds what follows: building the model, parameter and FLOP counts)."""

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
