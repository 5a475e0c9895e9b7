"""`KVCache`: the keys and values of every layer for incremental decoding."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax.numpy as jnp

from halyard.named import Axis, NamedArray


class KVCache(eqx.Module):
    """Keys and values written so far, one slot per token position.

    Attributes:
        key, value: NamedArrays ``(layers, batch, key_pos, kv_heads, head_size)``; a layer sees the slice
            without ``layers``. Slot ``t`` holds the token written at decode index ``t`` (see
            `halyard.models.sampling` for the left-padding convention).
    """

    key: NamedArray
    value: NamedArray

    @classmethod
    def zeros(
        cls,
        *,
        num_layers: int,
        batch_size: int,
        max_length: int,
        num_kv_heads: int,
        head_size: int,
        dtype: Any,
    ) -> KVCache:
        """An empty cache of ``max_length`` slots.

        Args:
            num_layers, batch_size, max_length, num_kv_heads, head_size: the axis sizes.
            dtype: the dtype keys and values are stored in (the compute dtype).
        """
        axes = (
            Axis("layers", num_layers),
            Axis("batch", batch_size),
            Axis("key_pos", max_length),
            Axis("kv_heads", num_kv_heads),
            Axis("head_size", head_size),
        )
        shape = tuple(a.size for a in axes)
        return cls(NamedArray(jnp.zeros(shape, dtype), axes), NamedArray(jnp.zeros(shape, dtype), axes))

    @property
    def max_length(self) -> int:
        """Number of slots (the ``key_pos`` size)."""
        return self.key.axis_size("key_pos")
