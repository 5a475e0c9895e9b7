"""Broadcasting by name: the one rule every elementwise op follows.

The rule:

1. Operands are NamedArrays or scalars (Python numbers, 0-d arrays). A plain array with dimensions
   is refused: it has no names, so there is nothing to match it by.
2. Axes match by **name**, never by position. An axis name present in several operands must have
   the same size everywhere; otherwise a ValueError names the axis and both operands' axes.
3. The result has the union of the operands' axes, ordered as in the first operand, followed by the
   axes of the second that the first lacks (in the second's order), and so on.

So ``x[batch, pos, embed] - x.mean("embed")[batch, pos]`` has axes ``(batch, pos, embed)``, and adding
``bias[embed]`` to ``h[pos, embed]`` works whatever the order of ``h``'s axes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray


def _is_scalar(x: Any) -> bool:
    if isinstance(x, int | float | complex | bool):
        return True
    return hasattr(x, "shape") and not isinstance(x, NamedArray) and len(x.shape) == 0


def union_axes(*arrays: NamedArray) -> tuple[Axis, ...]:
    """The axes of the broadcast result (rule 3), checking sizes (rule 2)."""
    result: dict[str, Axis] = {}
    owner: dict[str, NamedArray] = {}
    for arr in arrays:
        for axis in arr.axes:
            known = result.get(axis.name)
            if known is None:
                result[axis.name] = axis
                owner[axis.name] = arr
            elif known.size != axis.size:
                raise ValueError(
                    f"Axis {axis.name!r} has size {known.size} in {format_axes(owner[axis.name].axes)} "
                    f"but size {axis.size} in {format_axes(arr.axes)}"
                )
    return tuple(result.values())


def broadcast_to(x: NamedArray | Any, axes: Sequence[Axis], *, allow_extra: bool = False) -> NamedArray:
    """``x`` with exactly ``axes``, in that order, adding missing ones by broadcasting.

    Args:
        x: a NamedArray or a scalar.
        axes: the target axes.
        allow_extra: if False, ``x`` having an axis not in ``axes`` is an error.
    """
    axes = tuple(axes)
    if not isinstance(x, NamedArray):
        if not _is_scalar(x):
            raise TypeError(_positional_message(x))
        return NamedArray(jnp.broadcast_to(jnp.asarray(x), tuple(a.size for a in axes)), axes)
    target = {a.name: a for a in axes}
    for axis in x.axes:
        t = target.get(axis.name)
        if t is None:
            if not allow_extra:
                raise ValueError(
                    f"Cannot broadcast {format_axes(x.axes)} to {format_axes(axes)}: "
                    f"axis {axis.name!r} is not in the target"
                )
        elif t.size != axis.size:
            raise ValueError(
                f"Axis {axis.name!r} has size {axis.size} in {format_axes(x.axes)} "
                f"but size {t.size} in the target {format_axes(axes)}"
            )
    present = [a for a in axes if x.has_axis(a.name)]
    order = [x.axis_index(a.name) for a in present]
    data = x.array
    if order != list(range(len(order))) or len(order) != x.ndim:
        data = jnp.transpose(data, order)
    # Insert size-1 dims for missing axes, then broadcast.
    expanded_shape = tuple(a.size if x.has_axis(a.name) else 1 for a in axes)
    data = jnp.reshape(data, expanded_shape)
    data = jnp.broadcast_to(data, tuple(a.size for a in axes))
    return NamedArray(data, axes)


def broadcast_arrays(*xs: NamedArray | Any) -> tuple[NamedArray | Any, ...]:
    """Bring all NamedArray operands to their common axes (scalars pass through unchanged)."""
    named_ones = [x for x in xs if isinstance(x, NamedArray)]
    for x in xs:
        if not isinstance(x, NamedArray) and not _is_scalar(x):
            raise TypeError(_positional_message(x))
    if not named_ones:
        return xs
    axes = union_axes(*named_ones)
    return tuple(broadcast_to(x, axes) if isinstance(x, NamedArray) else x for x in xs)


def broadcast_axis(x: NamedArray, axes: Axis | Sequence[Axis]) -> NamedArray:
    """Add ``axes`` in front of ``x``'s axes (those already present are kept where they are)."""
    axes = (axes,) if isinstance(axes, Axis) else tuple(axes)
    new = [a for a in axes if not x.has_axis(a.name)]
    return broadcast_to(x, tuple(new) + x.axes)


def binary_op(op: Callable[[Any, Any], Any], a: Any, b: Any) -> NamedArray:
    """Apply a binary jnp function with broadcasting by name."""
    return elementwise(op, a, b)


def elementwise(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Apply ``op`` to the arrays of the arguments after broadcasting them by name."""
    if not any(isinstance(a, NamedArray) for a in args):
        return op(*args, **kwargs)
    brought = broadcast_arrays(*args)
    axes = next(a for a in brought if isinstance(a, NamedArray)).axes
    raw = [a.array if isinstance(a, NamedArray) else a for a in brought]
    return NamedArray(op(*raw, **kwargs), axes)


def _positional_message(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return (
        f"Cannot combine a NamedArray with a plain array of shape {shape}: it has no axis names to "
        f"broadcast by. Wrap it first, e.g. halyard.named.named(x, ('batch', 'embed'))."
    )


def axis_names_of(selection: AxisSelector | Sequence[AxisSelector]) -> tuple[str, ...]:
    """The names of one axis selector or several."""
    if isinstance(selection, Axis | str):
        return (axis_name(selection),)
    return tuple(axis_name(s) for s in selection)


__all__ = [
    "binary_op",
    "broadcast_arrays",
    "broadcast_axis",
    "broadcast_to",
    "elementwise",
    "union_axes",
]
