"""Random arrays by axes: ``normal(key, (Embed, Mlp))`` instead of positional shapes.

Every function takes a ``jax.random`` key and the result's axes (one `Axis` or a sequence, in order).
Parameters such as ``minval`` or ``p`` may be scalars or NamedArrays whose axes are among the result's
(they broadcast by name).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import AxisSelector
from halyard.named.broadcast import broadcast_to
from halyard.named.constructors import AxesArg, as_axes
from halyard.named.core import NamedArray


def _raw(value: Any, axes: tuple) -> Any:
    """A parameter as a plain array shaped like the result (NamedArrays broadcast by name)."""
    if isinstance(value, NamedArray):
        return broadcast_to(value, axes).array
    return value


def _shape(axes: tuple) -> tuple[int, ...]:
    return tuple(a.size for a in axes)


def normal(key: jax.Array, axes: AxesArg, dtype: Any = jnp.float32) -> NamedArray:
    """Standard normal samples with ``axes``.

    Args:
        key: a ``jax.random`` key.
        axes: the result's axes.
        dtype: a floating dtype.
    """
    axes = as_axes(axes)
    return NamedArray(jax.random.normal(key, _shape(axes), dtype), axes)


def uniform(
    key: jax.Array, axes: AxesArg, minval: Any = 0.0, maxval: Any = 1.0, dtype: Any = jnp.float32
) -> NamedArray:
    """Uniform samples in ``[minval, maxval)`` with ``axes``; bounds may be NamedArrays (by name)."""
    axes = as_axes(axes)
    low, high = _raw(minval, axes), _raw(maxval, axes)
    return NamedArray(jax.random.uniform(key, _shape(axes), dtype, low, high), axes)


def truncated_normal(
    key: jax.Array, axes: AxesArg, lower: Any = -2.0, upper: Any = 2.0, dtype: Any = jnp.float32
) -> NamedArray:
    """Standard normal samples conditioned on ``lower < x < upper`` (in standard deviations), with ``axes``.

    Scale the result for a given standard deviation: ``0.02 * truncated_normal(key, axes, -2, 2)``.
    """
    axes = as_axes(axes)
    low, high = _raw(lower, axes), _raw(upper, axes)
    return NamedArray(jax.random.truncated_normal(key, low, high, _shape(axes), dtype), axes)


def bernoulli(key: jax.Array, axes: AxesArg, p: Any = 0.5) -> NamedArray:
    """Booleans that are True with probability ``p`` (a scalar or a NamedArray broadcast by name)."""
    axes = as_axes(axes)
    return NamedArray(jax.random.bernoulli(key, _raw(p, axes), _shape(axes)), axes)


def randint(key: jax.Array, axes: AxesArg, minval: Any, maxval: Any, dtype: Any = jnp.int32) -> NamedArray:
    """Integers in ``[minval, maxval)`` with ``axes`` (e.g. random token ids)."""
    axes = as_axes(axes)
    low, high = _raw(minval, axes), _raw(maxval, axes)
    return NamedArray(jax.random.randint(key, _shape(axes), low, high, dtype), axes)


def categorical(key: jax.Array, logits: NamedArray, axis: AxisSelector) -> NamedArray:
    """Sample an index along ``axis`` with probabilities ``softmax(logits)``; ``axis`` is removed.

    Args:
        key: a ``jax.random`` key.
        logits: unnormalized log-probabilities, e.g. ``[batch, vocab]``.
        axis: the axis sampled over (``"vocab"``); the other axes are independent draws.

    Raises:
        KeyError: ``axis`` is not an axis of ``logits``.
    """
    index = logits.axis_index(axis)
    kept = logits.axes[:index] + logits.axes[index + 1 :]
    return NamedArray(jax.random.categorical(key, logits.array, axis=index), kept)


def permutation(key: jax.Array, x: NamedArray, axis: AxisSelector) -> NamedArray:
    """``x`` with its entries along ``axis`` shuffled (the same shuffle for every other index)."""
    index = x.axis_index(axis)
    return NamedArray(jax.random.permutation(key, x.array, axis=index, independent=False), x.axes)
