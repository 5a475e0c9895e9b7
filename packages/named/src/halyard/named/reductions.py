"""Reductions over named axes, with optional ``where=`` masks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, format_axes
from halyard.named.broadcast import broadcast_to
from halyard.named.core import NamedArray

AxisArg = AxisSelector | Sequence[AxisSelector] | None


def reduction_indices(x: NamedArray, axis: AxisArg) -> tuple[int, ...]:
    """Positions in ``x`` of ``axis`` (a name, an Axis, several, or None for all).

    Raises:
        KeyError: a name is not an axis of ``x`` (the message lists ``x``'s axes).
        ValueError: an axis is named twice.
    """
    if axis is None:
        return tuple(range(x.ndim))
    selection = (axis,) if isinstance(axis, Axis | str) else tuple(axis)
    indices = tuple(x.axis_index(a) for a in selection)
    if len(set(indices)) != len(indices):
        raise ValueError(f"Reduction names an axis twice: {axis!r} over {format_axes(x.axes)}")
    return indices


def _reduce(
    fn: Callable[..., Any], x: NamedArray, axis: AxisArg, where: Any = None, **kwargs: Any
) -> NamedArray:
    indices = reduction_indices(x, axis)
    if where is not None:
        # broadcast_to refuses plain arrays with dimensions: a mask must be matched by name too.
        kwargs["where"] = broadcast_to(where, x.axes).array
    out = fn(x.array, axis=indices, **kwargs)
    kept = tuple(a for i, a in enumerate(x.axes) if i not in indices)
    return NamedArray(out, kept)


def sum(x: NamedArray, axis: AxisArg = None, *, where: Any = None, dtype: Any = None) -> NamedArray:
    """Sum over ``axis`` (a name, several, or all when None); ``where`` masks elements out."""
    return _reduce(jnp.sum, x, axis, where, dtype=dtype)


def prod(x: NamedArray, axis: AxisArg = None, *, where: Any = None) -> NamedArray:
    """Product over ``axis``; ``where`` masks elements out (they count as 1)."""
    return _reduce(jnp.prod, x, axis, where)


def mean(x: NamedArray, axis: AxisArg = None, *, where: Any = None, dtype: Any = None) -> NamedArray:
    """Mean over ``axis``; with ``where`` the mean of the selected elements only."""
    return _reduce(jnp.mean, x, axis, where, dtype=dtype)


def var(x: NamedArray, axis: AxisArg = None, *, where: Any = None, ddof: int = 0) -> NamedArray:
    """Variance over ``axis`` (``ddof`` as in numpy); with ``where`` of the selected elements only."""
    return _reduce(jnp.var, x, axis, where, ddof=ddof)


def std(x: NamedArray, axis: AxisArg = None, *, where: Any = None, ddof: int = 0) -> NamedArray:
    """Standard deviation over ``axis``; with ``where`` of the selected elements only."""
    return _reduce(jnp.std, x, axis, where, ddof=ddof)


def max(x: NamedArray, axis: AxisArg = None, *, where: Any = None, initial: Any = None) -> NamedArray:
    """Maximum over ``axis``; with ``where``, ``initial`` is needed for all-masked slices (default -inf)."""
    if where is not None and initial is None:
        initial = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return _reduce(jnp.max, x, axis, where, initial=initial)


def min(x: NamedArray, axis: AxisArg = None, *, where: Any = None, initial: Any = None) -> NamedArray:
    """Minimum over ``axis``; with ``where``, ``initial`` covers all-masked slices (default +inf)."""
    if where is not None and initial is None:
        initial = jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).max
    return _reduce(jnp.min, x, axis, where, initial=initial)


def any(x: NamedArray, axis: AxisArg = None, *, where: Any = None) -> NamedArray:
    """Whether any element over ``axis`` is true."""
    return _reduce(jnp.any, x, axis, where)


def all(x: NamedArray, axis: AxisArg = None, *, where: Any = None) -> NamedArray:
    """Whether every element over ``axis`` is true."""
    return _reduce(jnp.all, x, axis, where)


def logsumexp(x: NamedArray, axis: AxisArg = None, *, where: Any = None) -> NamedArray:
    """log(sum(exp(x))) over ``axis``, computed stably."""
    return _reduce(jax.nn.logsumexp, x, axis, where)


def _arg_reduce(fn: Callable[..., Any], x: NamedArray, axis: AxisSelector | None) -> NamedArray:
    if axis is None:
        return NamedArray(fn(x.array.reshape(-1)), ())
    index = x.axis_index(axis)
    return NamedArray(fn(x.array, axis=index), tuple(a for i, a in enumerate(x.axes) if i != index))


def argmax(x: NamedArray, axis: AxisSelector | None) -> NamedArray:
    """Index of the maximum along one axis (or of the flattened array when None)."""
    return _arg_reduce(jnp.argmax, x, axis)


def argmin(x: NamedArray, axis: AxisSelector | None) -> NamedArray:
    """Index of the minimum along one axis (or of the flattened array when None)."""
    return _arg_reduce(jnp.argmin, x, axis)
