"""Indexing by name: ``x["pos", 3:7]``, ``x[{"batch": 0}]``, `take`, dynamic slices and ``.at`` updates.

An index names each axis it touches. Per axis the indexer may be:

- an ``int`` (or a 0-d integer array, possibly traced): the axis is removed;
- a ``slice`` with static bounds: the axis keeps its name with the new size;
- a NamedArray of integers: the axis is replaced by the index's axes. Axes the index shares with
  ``x`` are matched element by element (a batched gather), the others are new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.broadcast import broadcast_to
from halyard.named.core import NamedArray


def _as_mapping(x: NamedArray, index: Any) -> dict[str, Any]:
    if isinstance(index, Mapping):
        items = list(index.items())
    else:
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) % 2:
            raise TypeError(
                f"Index a NamedArray by name: x['pos', 3:7] or x[{{'pos': slice(3, 7)}}], got {index!r}"
            )
        items = list(zip(index[0::2], index[1::2]))
    result: dict[str, Any] = {}
    for key, value in items:
        if not isinstance(key, Axis | str):
            raise TypeError(f"Index keys must be axis names, got {key!r}; axes are {format_axes(x.axes)}")
        name = axis_name(key)
        x.axis_index(key)  # KeyError naming the axes when unknown
        if name in result:
            raise ValueError(f"Axis {name!r} is indexed twice")
        result[name] = value
    return result


def _is_int_index(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return (
        hasattr(value, "shape")
        and not isinstance(value, NamedArray)
        and value.shape == ()
        and jnp.issubdtype(value.dtype, jnp.integer)
    )


def _basic(x: NamedArray, basic: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Axis, ...]]:
    """The raw index tuple and resulting axes for int/slice indexers."""
    raw: list[Any] = []
    axes: list[Axis] = []
    for axis in x.axes:
        if axis.name not in basic:
            raw.append(slice(None))
            axes.append(axis)
            continue
        value = basic[axis.name]
        if isinstance(value, slice):
            start, stop, step = value.indices(axis.size)
            raw.append(value)
            axes.append(Axis(axis.name, len(range(start, stop, step))))
        elif _is_int_index(value):
            if isinstance(value, int) and not -axis.size <= value < axis.size:
                raise IndexError(f"Index {value} is out of range for axis {axis.name!r} of size {axis.size}")
            raw.append(value)
        else:
            raise TypeError(
                f"Cannot index axis {axis.name!r} with {value!r}: use an int, a slice or a NamedArray of ints"
            )
    return tuple(raw), tuple(axes)


def index(x: NamedArray, idx: Any) -> NamedArray:
    """``x[idx]`` by name (see the module docstring)."""
    selection = _as_mapping(x, idx)
    basic = {k: v for k, v in selection.items() if not isinstance(v, NamedArray)}
    advanced = {k: v for k, v in selection.items() if isinstance(v, NamedArray)}
    if basic:
        raw, axes = _basic(x, basic)
        x = NamedArray(x.array[raw], axes)
    for name, indexer in advanced.items():
        x = take(x, name, indexer)
    return x


def _wrap_negative(indices: jax.Array, size: int) -> jax.Array:
    """Python's meaning for negative positions (-1 is the last); what stays out of range is clamped later."""
    return jnp.where(indices < 0, indices + size, indices)


def take(x: NamedArray, axis: AxisSelector, indices: NamedArray) -> NamedArray:
    """Select along ``axis`` with an integer NamedArray; ``axis`` is replaced by the index's axes.

    Axes shared by ``x`` and ``indices`` (other than ``axis``) are batch axes: element ``b`` of the
    index picks from element ``b`` of ``x``. Negative indices count from the end; indices still out
    of range are clamped to the nearest valid position (XLA gathers cannot raise).

    Raises:
        ValueError: ``indices`` has the axis being indexed, or a shared axis has another size.
    """
    k = x.axis_index(axis)
    name = x.axes[k].name
    if indices.has_axis(name):
        raise ValueError(
            f"take: the index {format_axes(indices.axes)} must not have the indexed axis {name!r}"
        )
    shared = [a for a in indices.axes if x.has_axis(a.name)]
    for a in shared:
        if x.axis(a.name).size != a.size:
            raise ValueError(
                f"Axis {a.name!r} has size {x.axis(a.name).size} in {format_axes(x.axes)} "
                f"but size {a.size} in the index {format_axes(indices.axes)}"
            )
    if not shared:
        result = jnp.take(x.array, _wrap_negative(indices.array, x.axes[k].size), axis=k, mode="clip")
        return NamedArray(result, x.axes[:k] + indices.axes + x.axes[k + 1 :])
    # Batched gather: the result has x's axes with `axis` replaced by the index's new axes.
    new = tuple(a for a in indices.axes if not x.has_axis(a.name))
    out_axes = x.axes[:k] + new + x.axes[k + 1 :]
    out_shape = tuple(a.size for a in out_axes)
    raw_index = []
    for i, a in enumerate(x.axes):
        if i == k:
            wrapped = _wrap_negative(broadcast_to(indices, out_axes).array, a.size)
            raw_index.append(jnp.clip(wrapped, 0, a.size - 1))
        else:
            position = out_axes.index(a)
            shape = [1] * len(out_axes)
            shape[position] = a.size
            raw_index.append(jnp.broadcast_to(jnp.arange(a.size).reshape(shape), out_shape))
    return NamedArray(x.array[tuple(raw_index)], out_axes)


def dynamic_slice(x: NamedArray, axis: AxisSelector, start: Any, length: int) -> NamedArray:
    """``length`` elements of ``axis`` from a (possibly traced) ``start``; the axis keeps its name."""
    k = x.axis_index(axis)
    out = jax.lax.dynamic_slice_in_dim(x.array, start, length, axis=k)
    return NamedArray(out, x.axes[:k] + (x.axes[k].resize(length),) + x.axes[k + 1 :])


def dynamic_update_slice(x: NamedArray, starts: Mapping[AxisSelector, Any], update: NamedArray) -> NamedArray:
    """Write ``update`` into ``x`` at ``starts`` (``{axis: start}``, missing axes start at 0).

    ``update`` must have exactly ``x``'s axis names (any order), each no larger than in ``x``.
    """
    if sorted(update.axis_names) != sorted(x.axis_names):
        raise ValueError(
            f"dynamic_update_slice: update {format_axes(update.axes)} "
            f"must have the axes of {format_axes(x.axes)}"
        )
    update = update.rearrange(*x.axis_names)
    names = {axis_name(k): v for k, v in starts.items()}
    for n in names:
        x.axis_index(n)
    start_indices = [names.get(a.name, 0) for a in x.axes]
    return NamedArray(
        jax.lax.dynamic_update_slice(x.array, update.array.astype(x.dtype), start_indices), x.axes
    )


class AtIndexer:
    """``x.at[idx]`` with ``.get()``, ``.set(v)``, ``.add(v)``, ``.multiply(v)``, ``.min(v)``, ``.max(v)``."""

    def __init__(self, x: NamedArray):
        self._x = x

    def __getitem__(self, idx: Any) -> _AtRef:
        return _AtRef(self._x, idx)


class _AtRef:
    def __init__(self, x: NamedArray, idx: Any):
        selection = _as_mapping(x, idx)
        if any(isinstance(v, NamedArray) for v in selection.values()):
            raise TypeError(".at[...] takes ints and slices; use take() for NamedArray indices")
        self._x = x
        self._raw, self._axes = _basic(x, selection)

    def get(self) -> NamedArray:
        """The selected part (like ``x[idx]``)."""
        return NamedArray(self._x.array[self._raw], self._axes)

    def _apply(self, method: str, value: Any) -> NamedArray:
        raw_value = broadcast_to(value, self._axes).array
        ref = self._x.array.at[self._raw]
        return NamedArray(getattr(ref, method)(raw_value), self._x.axes)

    def set(self, value: Any) -> NamedArray:
        """A copy with the selection replaced by ``value`` (broadcast by name)."""
        return self._apply("set", value)

    def add(self, value: Any) -> NamedArray:
        """A copy with ``value`` added to the selection."""
        return self._apply("add", value)

    def multiply(self, value: Any) -> NamedArray:
        """A copy with the selection multiplied by ``value``."""
        return self._apply("multiply", value)

    def min(self, value: Any) -> NamedArray:
        """A copy with the selection replaced by ``minimum(selection, value)``."""
        return self._apply("min", value)

    def max(self, value: Any) -> NamedArray:
        """A copy with the selection replaced by ``maximum(selection, value)``."""
        return self._apply("max", value)
