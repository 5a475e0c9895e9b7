"""Symmetric int8 quantization with one scale per slice: the one quantizer of int8 training and int8 weights.

``q = round(x / scale)`` clipped to [-127, 127], with ``scale = max|x| / 127`` over the reduced dimensions
(a slice of zeros gets scale 1, so it stays zero). ``q * scale`` is within ``scale / 2`` of ``x`` in every
element: the bound the tests derive their tolerances from.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

INT8_MAX = 127.0


def absmax_int8(x: jax.Array, reduce: int | Sequence[int]) -> tuple[jax.Array, jax.Array]:
    """``x`` as int8 values and float32 scales, one scale per slice over the ``reduce`` dimensions.

    Args:
        x: a floating-point array.
        reduce: the dimension or dimensions that share a scale (for a matmul operand: its contracted
            dimensions, which gives per-row / per-channel scales).

    Returns:
        ``(q, scale)``: ``q`` int8 with ``x``'s shape, ``scale`` float32 with ``x``'s rank (size 1 along
        ``reduce``), such that ``q * scale`` approximates ``x``.
    """
    dims = (reduce,) if isinstance(reduce, int) else tuple(reduce)
    wide = x.astype(jnp.float32)
    peak = jnp.max(jnp.abs(wide), axis=dims, keepdims=True)
    scale = jnp.where(peak > 0, peak / INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(wide / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale
