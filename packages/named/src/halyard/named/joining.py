"""Cutting and joining along named axes: `split`, `concatenate`, `stack`, `unstack`."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray
from halyard.named.shape_ops import rearrange_axes


def split(x: NamedArray, axis: AxisSelector, parts: Sequence[int | Axis]) -> list[NamedArray]:
    """Cut ``x`` along ``axis`` into consecutive pieces.

    Args:
        x: the array.
        axis: the axis to cut.
        parts: one entry per piece: an int (the piece keeps the axis' name with that size) or an `Axis`
            (the piece's axis gets that name and size), e.g. ``(Axis("q", 64), Axis("kv", 128))``.

    Raises:
        ValueError: the sizes do not add up to the axis' size.
    """
    index = x.axis_index(axis)
    old = x.axes[index]
    new_axes = [p if isinstance(p, Axis) else Axis(old.name, p) for p in parts]
    total = sum(a.size for a in new_axes)
    if total != old.size:
        raise ValueError(
            f"split: pieces {[a.size for a in new_axes]} of axis {old.name!r} add up to {total}, "
            f"but it has size {old.size} in {format_axes(x.axes)}"
        )
    boundaries = np.cumsum([a.size for a in new_axes])[:-1].tolist()
    pieces = jnp.split(x.array, boundaries, axis=index)
    return [
        NamedArray(piece, x.axes[:index] + (new,) + x.axes[index + 1 :])
        for piece, new in zip(pieces, new_axes)
    ]


def _aligned(arrays: Sequence[NamedArray], what: str, skip: str | None) -> list[NamedArray]:
    """All arrays transposed to the first one's order; their axis names (and sizes, but ``skip``) must agree."""
    if not arrays:
        raise ValueError(f"{what} needs at least one array")
    first = arrays[0]
    result = [first]
    for other in arrays[1:]:
        if sorted(other.axis_names) != sorted(first.axis_names):
            raise ValueError(
                f"{what}: all arrays need the same axis names, got {format_axes(first.axes)} and "
                f"{format_axes(other.axes)}"
            )
        for a in other.axes:
            if a.name != skip and first.axis(a.name).size != a.size:
                raise ValueError(
                    f"{what}: axis {a.name!r} has size {first.axis(a.name).size} in {format_axes(first.axes)} "
                    f"but size {a.size} in {format_axes(other.axes)}"
                )
        result.append(rearrange_axes(other, first.axis_names))
    return result


def concatenate(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Join ``arrays`` end to end along ``axis``, which each of them has (its sizes may differ).

    The other axes must agree by name and size (any order: later arrays are aligned to the first).

    Args:
        axis: the name to join along, or an `Axis` whose size (the total) is then checked.
        arrays: the pieces, in order.

    Raises:
        KeyError: an array lacks ``axis``.
        ValueError: the arrays' other axes differ, or the total differs from ``axis.size``.
    """
    name = axis_name(axis)
    for a in arrays:
        a.axis_index(name)
    aligned = _aligned(arrays, "concatenate", skip=name)
    index = aligned[0].axis_index(name)
    total = sum(a.axis_size(name) for a in aligned)
    if isinstance(axis, Axis) and axis.size != total:
        raise ValueError(f"concatenate: the pieces along {name!r} add up to {total}, not {axis.size}")
    out_axes = aligned[0].axes[:index] + (Axis(name, total),) + aligned[0].axes[index + 1 :]
    return NamedArray(jnp.concatenate([a.array for a in aligned], axis=index), out_axes)


def stack(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Stack equally shaped ``arrays`` along a new first axis ``axis`` (its size is ``len(arrays)``).

    Raises:
        ValueError: the arrays' axes differ, one of them already has ``axis``, or ``axis`` is an `Axis`
            with another size.
    """
    name = axis_name(axis)
    aligned = _aligned(arrays, "stack", skip=None)
    if aligned[0].has_axis(name):
        raise ValueError(f"stack: the arrays {format_axes(aligned[0].axes)} already have an axis {name!r}")
    if isinstance(axis, Axis) and axis.size != len(arrays):
        raise ValueError(f"stack: {axis!r} has size {axis.size}, but {len(arrays)} arrays were given")
    return NamedArray(jnp.stack([a.array for a in aligned]), (Axis(name, len(arrays)),) + aligned[0].axes)


def unstack(x: NamedArray, axis: AxisSelector) -> list[NamedArray]:
    """The slices of ``x`` along ``axis`` (which they lack), in order: the inverse of `stack`."""
    index = x.axis_index(axis)
    kept = x.axes[:index] + x.axes[index + 1 :]
    return [NamedArray(jnp.take(x.array, i, axis=index), kept) for i in range(x.axes[index].size)]
