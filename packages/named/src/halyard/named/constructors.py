"""Arrays made from axes: `zeros`, `ones`, `full`, `arange`, `one_hot` and their ``*_like`` forms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, check_unique
from halyard.named.core import NamedArray

AxesArg = Axis | Sequence[Axis]


def as_axes(axes: AxesArg) -> tuple[Axis, ...]:
    """One `Axis` or several as a tuple of Axes; names (strings) are refused since a size is needed.

    Raises:
        TypeError: an element is not an `Axis` (a bare name has no size to build an array with).
    """
    result = (axes,) if isinstance(axes, Axis) else tuple(axes)
    for axis in result:
        if not isinstance(axis, Axis):
            raise TypeError(
                f"Expected Axis objects (a name and a size), got {axis!r}; "
                f"write Axis({axis!r}, size) to create an array along it"
            )
    check_unique(result)
    return result


def _shape(axes: tuple[Axis, ...]) -> tuple[int, ...]:
    return tuple(a.size for a in axes)


def zeros(axes: AxesArg, dtype: Any = jnp.float32) -> NamedArray:
    """An array of zeros with ``axes`` (one Axis or a sequence, in that order)."""
    axes = as_axes(axes)
    return NamedArray(jnp.zeros(_shape(axes), dtype), axes)


def ones(axes: AxesArg, dtype: Any = jnp.float32) -> NamedArray:
    """An array of ones with ``axes``."""
    axes = as_axes(axes)
    return NamedArray(jnp.ones(_shape(axes), dtype), axes)


def full(axes: AxesArg, fill_value: Any, dtype: Any = None) -> NamedArray:
    """An array with ``axes`` filled with ``fill_value`` (dtype inferred from it when None)."""
    axes = as_axes(axes)
    return NamedArray(jnp.full(_shape(axes), fill_value, dtype), axes)


def zeros_like(x: NamedArray, dtype: Any = None) -> NamedArray:
    """Zeros with the axes (and by default the dtype) of ``x``."""
    return NamedArray(jnp.zeros_like(x.array, dtype), x.axes)


def ones_like(x: NamedArray, dtype: Any = None) -> NamedArray:
    """Ones with the axes (and by default the dtype) of ``x``."""
    return NamedArray(jnp.ones_like(x.array, dtype), x.axes)


def full_like(x: NamedArray, fill_value: Any, dtype: Any = None) -> NamedArray:
    """``fill_value`` everywhere, with the axes (and by default the dtype) of ``x``."""
    return NamedArray(jnp.full_like(x.array, fill_value, dtype), x.axes)


def arange(axis: Axis, start: Any = 0, step: Any = 1, dtype: Any = jnp.int32) -> NamedArray:
    """``start, start + step, ...`` along ``axis`` (``axis.size`` values): positions, ids, offsets.

    Args:
        axis: the one axis of the result; its size is the number of values.
        start: the first value.
        step: the difference between neighbours.
        dtype: the result's dtype (int32 by default; pass a float dtype for fractional steps).
    """
    (axis,) = as_axes(axis)
    values = start + step * jnp.arange(axis.size, dtype=dtype)
    return NamedArray(values.astype(dtype), (axis,))


def one_hot(indices: NamedArray | int | jax.Array, axis: Axis, dtype: Any = jnp.float32) -> NamedArray:
    """One-hot encode ``indices`` along a new ``axis``: the result has ``indices``' axes then ``axis``.

    Args:
        indices: integer NamedArray (or a scalar index) of class ids in ``[0, axis.size)``; ids out of
            range give an all-zero row (as ``jax.nn.one_hot``).
        axis: the new axis, e.g. ``Vocab``; its size is the number of classes.
        dtype: the result's dtype.

    Raises:
        ValueError: ``indices`` already has an axis called ``axis.name``.
        TypeError: ``indices`` is a plain array with dimensions (wrap it with names first).
    """
    (axis,) = as_axes(axis)
    if isinstance(indices, NamedArray):
        if indices.has_axis(axis.name):
            raise ValueError(
                f"one_hot: the indices {indices!r} already have an axis {axis.name!r}; "
                f"rename one of them (x.rename({{{axis.name!r}: 'other'}}))"
            )
        return NamedArray(jax.nn.one_hot(indices.array, axis.size, dtype=dtype), indices.axes + (axis,))
    raw = jnp.asarray(indices)
    if raw.ndim != 0:
        raise TypeError(
            f"one_hot: plain indices of shape {raw.shape} have no axis names; wrap them with "
            f"halyard.named.named(indices, (...names...)) first"
        )
    return NamedArray(jax.nn.one_hot(raw, axis.size, dtype=dtype), (axis,))
