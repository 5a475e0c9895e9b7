"""Running totals along a named axis: `cumsum`, `cumprod`, `cummax`, `cummin`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from halyard.named.axis import AxisSelector
from halyard.named.core import NamedArray


def _cumulative(fn: Callable[..., Any], x: NamedArray, axis: AxisSelector, reverse: bool) -> NamedArray:
    index = x.axis_index(axis)
    return NamedArray(fn(x.array, axis=index, reverse=reverse), x.axes)


def cumsum(x: NamedArray, axis: AxisSelector, *, reverse: bool = False) -> NamedArray:
    """Running sum along ``axis`` (inclusive: entry i adds entries 0..i; from the end when ``reverse``)."""
    return _cumulative(jax.lax.cumsum, x, axis, reverse)


def cumprod(x: NamedArray, axis: AxisSelector, *, reverse: bool = False) -> NamedArray:
    """Running product along ``axis`` (inclusive)."""
    return _cumulative(jax.lax.cumprod, x, axis, reverse)


def cummax(x: NamedArray, axis: AxisSelector, *, reverse: bool = False) -> NamedArray:
    """Running maximum along ``axis`` (inclusive)."""
    return _cumulative(jax.lax.cummax, x, axis, reverse)


def cummin(x: NamedArray, axis: AxisSelector, *, reverse: bool = False) -> NamedArray:
    """Running minimum along ``axis`` (inclusive)."""
    return _cumulative(jax.lax.cummin, x, axis, reverse)
