"""`LoraAdapter`: the low-rank update of one linear layer (or of one per stacked layer)."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named import Axis, NamedArray, dot, random
from halyard.named.nn import DotGeneral, Dropout, Linear

RANK = "lora_rank"
"""The name of the adapters' rank axis (no layout rule names it, so it is never split)."""


class LoraAdapter(eqx.Module):
    """``x -> (dropout(x) · A · B) * alpha / rank``, added to a `Linear`'s output by `LoraLinear`.

    Attributes:
        lora_a: A, axes ``(stacked..., in..., lora_rank)``: the Linear's ``In`` axes, after the axes it is
            stacked on (``layers`` in a scanned block).
        lora_b: B, axes ``(stacked..., lora_rank, out...)``.
        alpha: the scale numerator (static); the update is multiplied by ``alpha / rank``.
        dropout: dropout rate on the input (static); applied only while ``dropout_key`` is set.
        dropout_key: raw PRNG key data ``(stacked..., key words)`` for this step's dropout masks (set by
            `with_dropout_keys` inside the train step), or None: no dropout.
    """

    lora_a: NamedArray
    lora_b: NamedArray
    alpha: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True, default=0.0)
    dropout_key: jax.Array | None = None

    @classmethod
    def init(
        cls, linear: Linear, *, rank: int, alpha: float, dropout: float = 0.0, key: jax.Array
    ) -> LoraAdapter:
        """A fresh adapter for ``linear``: A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is PEFT's
        default (``kaiming_uniform_(a=sqrt(5))`` of lora_A), and B = 0, so the model starts unchanged.

        Args:
            linear: the layer to adapt; axes of its weight before ``In`` (``layers``) stack the adapter too.
            rank: the ``lora_rank`` size.
            alpha: the scale numerator.
            dropout: dropout rate on the adapter's input while training.
            key: PRNG key for A.
        """
        stacked = linear.weight.axes[: linear.weight.ndim - len(linear.In) - len(linear.Out)]
        Rank = Axis(RANK, rank)
        bound = 1.0 / math.sqrt(math.prod(axis.size for axis in linear.In))
        dtype = linear.weight.dtype
        lora_a = random.uniform(key, (*stacked, *linear.In, Rank), -bound, bound, jnp.float32).astype(dtype)
        lora_b = NamedArray(jnp.zeros((*(a.size for a in stacked), rank, *(a.size for a in linear.Out)), dtype),
                            (*stacked, Rank, *linear.Out))  # fmt: skip
        return cls(lora_a, lora_b, float(alpha), float(dropout))

    @property
    def rank(self) -> int:
        """The ``lora_rank`` size."""
        return self.lora_b.axis_size(RANK)

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    @property
    def stacked_axes(self) -> tuple[Axis, ...]:
        """The axes the adapter is stacked on (those of B before ``lora_rank``)."""
        return self.lora_b.axes[: self.lora_b.axis_index(RANK)]

    def __call__(
        self, x: NamedArray, In: tuple[Axis, ...], Out: tuple[Axis, ...], dot_general: DotGeneral
    ) -> NamedArray:
        """The update for input ``x`` (one layer's adapter: no stacked axes left).

        Args:
            x: the Linear's input, holding every ``In`` axis.
            In, Out: the Linear's axes.
            dot_general: the Linear's contraction.
        """
        if self.dropout and self.dropout_key is not None:
            x = Dropout(self.dropout)(x, key=jax.random.wrap_key_data(self.dropout_key))
        Rank = self.lora_a.axis(RANK)
        down = Linear(self.lora_a, None, In, (Rank,), dot_general)(x)
        return Linear(self.lora_b, None, (Rank,), Out, dot_general)(down) * self.scale

    def delta(self) -> NamedArray:
        """``A · B * alpha / rank`` in float32, axes ``(stacked..., in..., out...)``: what merging adds."""
        return (
            dot(
                self.lora_a.astype(jnp.float32),
                self.lora_b.astype(jnp.float32),
                axis=RANK,
                precision=jax.lax.Precision.HIGHEST,
            )
            * self.scale
        )

    def with_dropout_key(self, key: jax.Array) -> LoraAdapter:
        """This adapter with one dropout key per stacked layer drawn from ``key`` (unchanged without dropout)."""
        if not self.dropout:
            return self
        shape = tuple(axis.size for axis in self.stacked_axes)
        keys = jax.random.key_data(jax.random.split(key, math.prod(shape)))
        return LoraAdapter(
            self.lora_a, self.lora_b, self.alpha, self.dropout, keys.reshape(*shape, *keys.shape[1:])
        )
