"""Symmetric int8 quantization with one scale per slice: the one quantizer of int8 training and int8 weights.

``q = round(x / scale)`` clipped to [-127, 127], with ``scale = max|x| / 127`` over the reduced dimensions
(a slice of zeros gets scale 1, so it stays zero). ``q * scale`` is within ``scale / 2`` of ``x`` in every
element: the bound the tests derive their tolerances from.

Stochastic rounding (``stochastic=True``, for gradients) rounds ``x / scale`` up with probability equal to
its fraction, so ``q * scale`` equals ``x`` in expectation and is within one ``scale`` of it. Values far
below the slice's peak then still count on average instead of all rounding to zero. The uniform numbers
come from a counter-based hash of each element's float32 bits and its position: no key to thread, the same
inputs give the same bits (a resumed run repeats its steps; a sharded array gives the single device's
bits), and different gradients get different noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

INT8_MAX = 127.0


def absmax_int8(
    x: jax.Array, reduce: int | Sequence[int], stochastic: bool = False
) -> tuple[jax.Array, jax.Array]:
    """``x`` as int8 values and float32 scales, one scale per slice over the ``reduce`` dimensions.

    Args:
        x: a floating-point array.
        reduce: the dimension or dimensions that share a scale (for a matmul operand: its contracted
            dimensions, which gives per-row / per-channel scales).
        stochastic: round stochastically (unbiased; module docstring) rather than to nearest.

    Returns:
        ``(q, scale)``: ``q`` int8 with ``x``'s shape, ``scale`` float32 with ``x``'s rank (size 1 along
        ``reduce``), such that ``q * scale`` approximates ``x``.
    """
    dims = (reduce,) if isinstance(reduce, int) else tuple(reduce)
    wide = x.astype(jnp.float32)
    peak = jnp.max(jnp.abs(wide), axis=dims, keepdims=True)
    scale = jnp.where(peak > 0, peak / INT8_MAX, 1.0)
    steps = wide / scale
    rounded = jnp.floor(steps + _uniform_hash(wide)) if stochastic else jnp.round(steps)
    q = jnp.clip(rounded, -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale


def _uniform_hash(x: jax.Array) -> jax.Array:
    """A number in [0, 1) for each element of float32 ``x``: murmur3's finalizer of its bits and position."""
    position = jnp.zeros(x.shape, jnp.uint32)
    for axis, size in enumerate(x.shape):
        position = position * jnp.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    h = jax.lax.bitcast_convert_type(x, jnp.uint32) ^ (position * jnp.uint32(0x9E3779B9))
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # the top 24 bits: exact in float32
