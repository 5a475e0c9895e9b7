"""`Embedding`: token ids to vectors, and back to logits for tied embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, format_axes
from halyard.named.contraction import dot
from halyard.named.core import NamedArray
from halyard.named.indexing import take
from halyard.named.nn._init import as_axes, normal


class Embedding(eqx.Module):
    """A lookup table with one row per vocabulary entry.

    Attributes:
        weight: a NamedArray with axes ``(Vocab, *Embed)``.
        Vocab: the vocabulary axis (static).
        Embed: the vector axis or axes (static).
    """

    weight: NamedArray
    Vocab: Axis = eqx.field(static=True)
    Embed: tuple[Axis, ...] = eqx.field(static=True)

    @classmethod
    def init(
        cls,
        Vocab: Axis,
        Embed: Axis | Sequence[Axis],
        *,
        key: jax.Array,
        init_std: float = 0.02,
        dtype: Any = jnp.float32,
    ) -> Embedding:
        """An embedding table drawn from N(0, init_std**2).

        Args:
            Vocab: the vocabulary axis, e.g. ``Axis("vocab", 50257)``.
            Embed: the vector axis (or axes), e.g. ``Axis("embed", 768)``.
            key: PRNG key.
            init_std: standard deviation of the entries (GPT-2 uses 0.02).
            dtype: parameter dtype.

        Raises:
            TypeError: an axis argument is not an `Axis`.
            ValueError: ``Embed`` reuses the vocabulary axis name.
        """
        if not isinstance(Vocab, Axis):
            raise TypeError(f"Embedding Vocab must be an Axis (e.g. Axis('vocab', 50257)), got {Vocab!r}")
        embed_axes = as_axes(Embed, "Embedding Embed")
        if Vocab.name in {a.name for a in embed_axes}:
            raise ValueError(
                f"Embedding Embed {format_axes(embed_axes)} must not reuse the vocab name {Vocab.name!r}"
            )
        weight = normal(key, (Vocab, *embed_axes), init_std, dtype)
        return cls(weight, Vocab, embed_axes)

    def __call__(self, ids: NamedArray) -> NamedArray:
        """Look up ``ids``: the result has ids' axes followed by ``Embed``.

        Args:
            ids: integer NamedArray (e.g. axes ``(batch, pos)``); values outside ``[0, vocab)`` are
                clipped, as jit cannot raise on data.

        Raises:
            TypeError: ``ids`` is not an integer NamedArray.
            ValueError: ``ids`` already has the vocab axis.
        """
        return self.embed(ids)

    def embed(self, ids: NamedArray) -> NamedArray:
        """Same as calling the layer: vectors for integer ``ids`` (axes: ids' axes, then ``Embed``)."""
        if not isinstance(ids, NamedArray) or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise TypeError(f"Embedding expects an integer NamedArray of token ids, got {ids!r}")
        looked_up = take(self.weight, self.Vocab.name, ids)
        return looked_up.rearrange(*ids.axis_names, ...)

    def unembed(self, x: NamedArray) -> NamedArray:
        """Logits over the vocabulary for hidden states ``x`` (tied input/output embeddings).

        Args:
            x: a NamedArray holding the ``Embed`` axes.

        Returns:
            ``x``'s other axes followed by ``Vocab``.

        Raises:
            KeyError / ValueError: an ``Embed`` axis is missing or has another size.
        """
        for axis in self.Embed:
            x.axis_index(axis)
        other = [a.name for a in x.axes if a.name not in {e.name for e in self.Embed}]
        return dot(x, self.weight, axis=self.Embed, out_axes=(*other, self.Vocab.name))
