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


def flatten_axes(x: NamedArray, axes: Sequence[AxisSelector], new_axis: AxisSelector) -> NamedArray:
    """Merge ``axes`` (in the given order, the first varying slowest) into one axis ``new_axis``.

    The merged axis takes the place of the first of ``axes`` in ``x``'s order; the other axes keep theirs.

    Args:
        x: the array.
        axes: the names to merge (at least one), e.g. ``("heads", "head_size")``.
        new_axis: the merged axis' name, or an `Axis` whose size is then checked.

    Raises:
        KeyError: an axis is not in ``x``.
        ValueError: an axis is named twice, or ``new_axis`` has the wrong size or clashes with a kept axis.
    """
    names = [axis_name(a) for a in axes]
    if not names:
        raise ValueError("flatten_axes needs at least one axis to merge")
    indices = [x.axis_index(a) for a in axes]
    if len(set(indices)) != len(indices):
        raise ValueError(f"flatten_axes: {names} names an axis twice")
    size = 1
    for i in indices:
        size *= x.axes[i].size
    if isinstance(new_axis, Axis) and new_axis.size != size:
        raise ValueError(
            f"flatten_axes: merging {names} of {format_axes(x.axes)} gives size {size}, not {new_axis.size}"
        )
    merged = Axis(axis_name(new_axis), size)
    first = min(indices)
    kept = [i for i in range(x.ndim) if i not in indices]
    before = [i for i in kept if i < first]
    after = [i for i in kept if i > first]
    moved = rearrange_axes(x, [x.axes[i].name for i in before + indices + after])
    out_axes = tuple(x.axes[i] for i in before) + (merged,) + tuple(x.axes[i] for i in after)
    return NamedArray(jnp.reshape(moved.array, tuple(a.size for a in out_axes)), out_axes)


def unflatten_axis(x: NamedArray, axis: AxisSelector, new_axes: Sequence[Axis]) -> NamedArray:
    """Split ``axis`` into ``new_axes`` (row-major: the first varies slowest), in its place.

    Args:
        x: the array.
        axis: the axis to split.
        new_axes: the parts, whose sizes multiply to the size of ``axis``.

    Raises:
        KeyError: ``axis`` is not in ``x``.
        ValueError: the sizes do not multiply to the axis' size, or a part's name clashes.
    """
    index = x.axis_index(axis)
    new_axes = tuple(new_axes)
    for part in new_axes:
        if not isinstance(part, Axis):
            raise TypeError(f"unflatten_axis: parts must be Axis objects (a name and a size), got {part!r}")
    size = 1
    for part in new_axes:
        size *= part.size
    if size != x.axes[index].size:
        raise ValueError(
            f"unflatten_axis: cannot split {x.axes[index]!r} of {format_axes(x.axes)} into "
            f"{format_axes(new_axes)}: the sizes multiply to {size}"
        )
    out_axes = x.axes[:index] + new_axes + x.axes[index + 1 :]
    return NamedArray(jnp.reshape(x.array, tuple(a.size for a in out_axes)), out_axes)
