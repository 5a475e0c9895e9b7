"""`apply_rotary`: rotate queries or keys by their positions (RoPE).

Numerics follow transformers' Llama rotary embedding: inverse frequencies from the rope-init rule of
the scaling type (frequencies.py), ``cos``/``sin`` of ``position * inv_freq`` in float32 (times the
attention factor for yarn and longrope), cast to the input's dtype, and the "rotate half" pairing (channel ``i``
pairs with channel ``i + rotary_dim / 2``). With ``partial_rotary_factor < 1`` only the first ``rotary_dim``
channels rotate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models.rotary.config import RotaryConfig
from halyard.models.rotary.frequencies import inverse_frequencies
from halyard.named import Axis, NamedArray
from halyard.named.nn import in_row_blocks, invariant_rows


def apply_rotary(
    x: NamedArray, positions: NamedArray, config: RotaryConfig, *, max_position: int
) -> NamedArray:
    """Rotate queries or keys by their positions.

    Args:
        x: ``(batch..., "pos", heads-like..., "head_size")`` (any order; the axis may also be
            ``key_pos`` when ``positions`` uses that name).
        positions: integer absolute positions ``(batch..., "pos")``; its axes must all be axes of ``x``
            (missing batch axes broadcast).
        config: the rotary configuration.
        max_position: the model's ``max_position_embeddings`` (see `inverse_frequencies`).

    Returns:
        ``x`` rotated, same axes, order and dtype.

    Raises:
        ValueError: ``x`` has no ``head_size`` axis, ``positions`` has an axis ``x`` lacks, the rotary
            dimension is odd, or a longrope factor list has the wrong length.
    """
    if not x.has_axis("head_size"):
        raise ValueError(f"apply_rotary: x has axes {x.axis_names} but needs a 'head_size' axis")
    missing = [name for name in positions.axis_names if not x.has_axis(name)]
    if missing:
        raise ValueError(f"apply_rotary: positions has axes {missing} that x {x.axis_names} lacks")
    head_size = x.axis_size("head_size")
    # Data-dependent scalings see the batch's longest sequence, as transformers' dynamic_rope_update does.
    dynamic = config.scaling in ("dynamic", "longrope")
    sequence_length = jnp.max(positions.array) + 1 if dynamic else None
    inv_freq, attention_factor = inverse_frequencies(
        config, head_size, max_position=max_position, sequence_length=sequence_length
    )
    dim = 2 * inv_freq.shape[0]
    angles = positions.array.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    RotaryChannels = Axis("head_size", dim)
    ordered = x.rearrange(..., "head_size")
    rotary_axes = (*ordered.axes[:-1], RotaryChannels)
    angle_array = hn.broadcast_to(NamedArray(angles, (*positions.axes, RotaryChannels)), rotary_axes).array
    rotating, passing = ordered.array[..., :dim], ordered.array[..., dim:]
    rotated = _rotated(rotating, angle_array, attention_factor)
    result = jnp.concatenate([rotated, passing], axis=-1) if passing.shape[-1] else rotated
    return NamedArray(result, ordered.axes).rearrange(*x.axis_names)


def _rotated(x: jax.Array, angles: jax.Array, attention_factor: float) -> jax.Array:
    """``x`` (its rotary channels) rotated by ``angles`` (float32, as ``x``'s shape). Inside `batch_invariant`
    computed in its blocks of rows (`in_row_blocks`): XLA contracts the rotation's multiply and add into a
    fused multiply-add in some programs' loops and not in others', so a token's keys depended on how many
    tokens its program has."""

    def rotate(x: jax.Array, angles: jax.Array) -> jax.Array:
        cos = (jnp.cos(angles) * attention_factor).astype(x.dtype)
        sin = (jnp.sin(angles) * attention_factor).astype(x.dtype)
        first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return x * cos + jnp.concatenate([-second, first], axis=-1) * sin

    rows = invariant_rows()
    if rows is None:
        return rotate(x, angles)
    both = jnp.stack([x.astype(jnp.float32), angles], axis=-2).reshape(-1, 2, x.shape[-1])  # x exact in f32
    rotated = in_row_blocks(lambda block: rotate(block[:, 0].astype(x.dtype), block[:, 1]), both, rows)
    return rotated.reshape(x.shape)
