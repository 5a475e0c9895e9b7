"""Operations on an array's axes that move no arithmetic: rename, transpose, unwrap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray


def rename(x: NamedArray, renames: Mapping[AxisSelector, str | Axis]) -> NamedArray:
    """Rename axes of ``x``; sizes stay.

    Args:
        x: the array.
        renames: ``{old: new}``; ``old`` is a name or Axis of ``x``, ``new`` a name (or an Axis of the
            same size).

    Raises:
        KeyError: an old name is not an axis of ``x``.
        ValueError: a new Axis has another size, or the result repeats a name.
    """
    mapping: dict[str, str] = {}
    for old, new in renames.items():
        index = x.axis_index(old)
        new_name = axis_name(new)
        if isinstance(new, Axis) and new.size != x.axes[index].size:
            raise ValueError(
                f"Cannot rename {axis_name(old)!r} (size {x.axes[index].size}) to {new!r}: sizes differ"
            )
        mapping[axis_name(old)] = new_name
    axes = tuple(Axis(mapping.get(a.name, a.name), a.size) for a in x.axes)
    return NamedArray(x.array, axes)


def rearrange_axes(x: NamedArray, order: Sequence[Any]) -> NamedArray:
    """Transpose ``x`` to ``order`` (names or Axes); one ``...`` stands for all axes not named.

    Raises:
        ValueError: ``order`` names an axis twice, or omits axes without ``...``.
        KeyError: ``order`` names an axis ``x`` does not have.
    """
    order = list(order)
    if order.count(Ellipsis) > 1:
        raise ValueError("At most one ... in an axis order")
    named = [o for o in order if o is not Ellipsis]
    indices = [x.axis_index(o) for o in named]
    if len(set(indices)) != len(indices):
        raise ValueError(f"Axis order {order!r} names an axis twice")
    rest = [i for i in range(x.ndim) if i not in indices]
    if Ellipsis in order:
        pos = order.index(Ellipsis)
        perm = indices[:pos] + rest + indices[pos:]
    else:
        if rest:
            missing = [x.axes[i].name for i in rest]
            raise ValueError(
                f"Axis order {order!r} leaves out {missing} of {format_axes(x.axes)}; add ... to keep them"
            )
        perm = indices
    if perm == list(range(x.ndim)):
        return x
    return NamedArray(jnp.transpose(x.array, perm), tuple(x.axes[i] for i in perm))


def unwrap(x: NamedArray, *axes: AxisSelector) -> jax.Array:
    """The plain array, transposed to ``axes`` when given (then every axis must be named)."""
    if not axes:
        return x.array
    return rearrange_axes(x, axes).array
