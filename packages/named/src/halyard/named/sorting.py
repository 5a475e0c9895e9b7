"""Order along a named axis: `sort`, `argsort`, `top_k`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray


def sort(x: NamedArray, axis: AxisSelector, *, descending: bool = False) -> NamedArray:
    """``x`` sorted along ``axis`` (stable; NaNs last); every other index is sorted on its own."""
    index = x.axis_index(axis)
    return NamedArray(jnp.sort(x.array, axis=index, stable=True, descending=descending), x.axes)


def argsort(x: NamedArray, axis: AxisSelector, *, descending: bool = False) -> NamedArray:
    """The positions along ``axis`` that would sort ``x`` (stable: ties keep their order)."""
    index = x.axis_index(axis)
    return NamedArray(jnp.argsort(x.array, axis=index, stable=True, descending=descending), x.axes)


def top_k(
    x: NamedArray, axis: AxisSelector, k: int, new_axis: AxisSelector | None = None
) -> tuple[NamedArray, NamedArray]:
    """The ``k`` largest entries along ``axis``, largest first, and their positions along it.

    Args:
        x: the array, e.g. router logits ``[batch, pos, experts]``.
        axis: the axis searched.
        k: how many to keep (``0 <= k <= size``).
        new_axis: the name of the result's axis of size ``k`` (default: ``axis``' name).

    Returns:
        ``(values, indices)``: both with ``axis`` replaced, in place, by the new axis of size ``k``.

    Raises:
        ValueError: ``k`` is out of range, or ``new_axis`` clashes with another axis of ``x``.
    """
    index = x.axis_index(axis)
    old = x.axes[index]
    if not 0 <= k <= old.size:
        raise ValueError(f"top_k: k={k} is out of range for axis {old.name!r} of size {old.size}")
    name = old.name if new_axis is None else axis_name(new_axis)
    if name != old.name and x.has_axis(name):
        raise ValueError(f"top_k: new axis {name!r} clashes with an axis of {format_axes(x.axes)}")
    moved = jnp.moveaxis(x.array, index, -1)
    values, positions = jax.lax.top_k(moved, k)
    out_axes = x.axes[:index] + (Axis(name, k),) + x.axes[index + 1 :]
    return (
        NamedArray(jnp.moveaxis(values, -1, index), out_axes),
        NamedArray(jnp.moveaxis(positions, -1, index), out_axes),
    )
