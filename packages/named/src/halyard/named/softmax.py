"""Normalized exponentials over named axes: `softmax`, `log_softmax`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.broadcast import broadcast_to
from halyard.named.core import NamedArray
from halyard.named.reductions import AxisArg, reduction_indices


def _prepare(x: NamedArray, axis: AxisArg, where: Any) -> tuple[tuple[int, ...], Any]:
    indices = reduction_indices(x, axis)
    if isinstance(where, NamedArray):
        where = broadcast_to(where, x.axes).array
    return indices, where


def softmax(x: NamedArray, axis: AxisArg, *, where: Any = None) -> NamedArray:
    """``exp(x) / sum(exp(x))`` over ``axis`` (one name or several), computed stably; axes are unchanged.

    Args:
        x: the logits.
        axis: the axis (or axes) the probabilities sum to one over, e.g. ``"key_pos"`` or ``"vocab"``.
        where: optional boolean mask broadcast by name to ``x``; masked-out entries get probability 0
            and do not count in the normalization. (A fully masked row gives zeros, not NaN.)

    Raises:
        KeyError: ``axis`` is not an axis of ``x``.
    """
    indices, mask = _prepare(x, axis, where)
    if mask is None:
        return NamedArray(jax.nn.softmax(x.array, axis=indices), x.axes)
    neg = jnp.finfo(x.dtype).min if jnp.issubdtype(x.dtype, jnp.floating) else -jnp.inf
    masked = jnp.where(mask, x.array, neg)
    shifted = masked - jax.lax.stop_gradient(jnp.max(masked, axis=indices, keepdims=True))
    unnormalized = jnp.where(mask, jnp.exp(shifted), 0)
    total = jnp.sum(unnormalized, axis=indices, keepdims=True)
    return NamedArray(unnormalized / jnp.where(total == 0, 1, total), x.axes)


def log_softmax(x: NamedArray, axis: AxisArg, *, where: Any = None) -> NamedArray:
    """``x - logsumexp(x)`` over ``axis``, computed stably; axes are unchanged.

    Args:
        x: the logits.
        axis: the axis (or axes) normalized over, e.g. ``"vocab"``.
        where: optional boolean mask broadcast by name to ``x``; masked-out entries are ``-inf``.

    Raises:
        KeyError: ``axis`` is not an axis of ``x``.
    """
    indices, mask = _prepare(x, axis, where)
    if mask is None:
        return NamedArray(jax.nn.log_softmax(x.array, axis=indices), x.axes)
    neg = jnp.finfo(x.dtype).min if jnp.issubdtype(x.dtype, jnp.floating) else -jnp.inf
    masked = jnp.where(mask, x.array, neg)
    shifted = masked - jax.lax.stop_gradient(jnp.max(masked, axis=indices, keepdims=True))
    log_total = jnp.log(jnp.sum(jnp.where(mask, jnp.exp(shifted), 0), axis=indices, keepdims=True))
    return NamedArray(jnp.where(mask, shifted - log_total, -jnp.inf), x.axes)
