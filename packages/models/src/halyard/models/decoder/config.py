"""`DecoderConfig`: the base of every decoder family's config, and what follows from a family's answers.

A family's config is a frozen dataclass with its own fields (named as its papers and checkpoints name
them); it derives from `DecoderConfig` and answers the questions of `DecoderSpec` (spec.py): the model's
sizes, how a layer is arranged, what differs per layer, and the few hooks where a family's embedding or
output differ. The model (`init`), parameter and FLOP counts follow from those answers.
"""

from __future__ import annotations

import dataclasses

import jax

from halyard.models.decoder.model import Decoder
from halyard.models.decoder.spec import DecoderSpec
from halyard.models.flops import decoder_flops_per_token
from halyard.named.nn import activation


@dataclasses.dataclass(frozen=True)
class DecoderConfig(DecoderSpec):
    """Base of every decoder family's config (fields: `ModelConfig`'s; the family adds its own)."""

    def init(self, key: jax.Array) -> Decoder:
        """The model with freshly initialised parameters (see `Decoder.init`)."""
        return Decoder.init(self, key=key)

    def num_params(self) -> int:
        """Parameter count (tied embeddings once)."""
        s, layout = self.shape, self.layout()
        embed, size = s.embed, s.head_size
        attention = embed * size * (s.heads + 2 * s.kv_heads) + s.heads * size * embed
        if layout.qkv_bias:
            attention += size * (s.heads + 2 * s.kv_heads)
        if layout.out_bias:
            attention += embed
        if layout.qk_norm == "head":
            attention += 2 * size
        elif layout.qk_norm == "projection":
            attention += size * (s.heads + s.kv_heads)
        per_norm = (2 if layout.norm == "layer" else 1) * embed if layout.norm_gains else 0
        per_layer = attention + self._mlp_params() + layout.norms_per_layer * per_norm
        embeddings = s.vocab * embed * (1 if s.tie_embeddings else 2)
        if s.learned_positions:
            embeddings += s.max_position * embed
        return s.layers * per_layer + embeddings + per_norm

    def _mlp_params(self) -> int:
        s, layout = self.shape, self.layout()
        if layout.mlp == "moe":
            return layout.num_experts * (3 * s.embed * s.mlp + s.embed)
        projections = 2 if layout.mlp == "plain" else 3
        bias = (projections - 1) * s.mlp + s.embed if layout.mlp_bias else 0
        return projections * s.embed * s.mlp + bias

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), each layer at its own window; see `halyard.models.flops`."""
        s = self.shape
        mlp = self._mlp_params_per_token()

        def flops(num_layers: int, window: int | None) -> float:
            return decoder_flops_per_token(
                matmul_params_per_layer=s.embed * s.head_size * (2 * s.heads + 2 * s.kv_heads) + mlp,
                num_layers=num_layers,
                attention_width=s.heads * s.head_size,
                vocab_size=s.vocab,
                hidden_size=s.embed,
                seq_len=seq_len,
                sliding_window=window,
            )

        # The output projection is counted once; each windowed layer attends to fewer keys.
        total = flops(s.layers, None)
        for kind in self.layer_kinds():
            if kind.window is not None:
                total += flops(1, kind.window) - flops(1, None)
        return total

    def int8_flops_per_token(self) -> float:
        """Of `flops_per_token`, the training FLOPs per token ``quantization: int8`` runs as int8 matmuls: the
        layers' projections (q, k, v, o and the MLP; forward and both gradient products); 0 without it."""
        if self.quantization != "int8":
            return 0.0
        s = self.shape
        projections = s.embed * s.head_size * (2 * s.heads + 2 * s.kv_heads) + self._mlp_params_per_token()
        return 3.0 * 2 * s.layers * projections

    def _mlp_params_per_token(self) -> int:
        s, layout = self.shape, self.layout()
        if layout.mlp == "moe":
            return layout.experts_per_token * 3 * s.embed * s.mlp + layout.num_experts * s.embed
        return (2 if layout.mlp == "plain" else 3) * s.embed * s.mlp


def check_positive(config: object, *fields: str, optional: bool = False) -> None:
    """ValueError naming ``Config.field`` for the first of ``fields`` that is not above 0 (with
    ``optional``, None passes: an option that is off)."""
    for field in fields:
        value = getattr(config, field)
        if not (optional and value is None) and not value > 0:
            what = "positive or None" if optional else "positive"
            raise ValueError(f"{type(config).__name__}.{field} must be {what}, got {value}")


def check_activation(name: str, owner: str) -> None:
    """ValueError naming ``owner`` (e.g. ``LlamaConfig.activation``) when ``name`` is not an activation."""
    try:
        activation(name)
    except ValueError as error:
        raise ValueError(f"{owner}={name!r}: {error}") from None
