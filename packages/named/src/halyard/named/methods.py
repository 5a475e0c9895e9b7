"""`NamedArray`'s methods that are named ops (``x.sum("embed")``, ``x["pos", 3]``, ``x + y``), bound here.

The ops (broadcast.py, indexing.py, rearrange.py, reductions.py, shape_ops.py) build NamedArrays, so they
import core.py; core.py imports none of them. This module, above both, hands the class its methods when
``halyard.named`` is imported (which any import of a module of the package does first). core.py declares
the methods for type checkers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from halyard.named import broadcast, indexing, reductions, shape_ops
from halyard.named.axis import AxisSelector
from halyard.named.core import NamedArray
from halyard.named.rearrange import rearrange as rearrange_spec


def rearrange(x: NamedArray, *axes: AxisSelector | Any, **sizes: int) -> NamedArray:
    """``x.rearrange``: a ``"lhs -> rhs"`` spec (`halyard.named.rearrange`) or an axis order (`rearrange_axes`).

    Raises:
        TypeError: ``sizes`` given with an axis order (they belong to a spec string).
    """
    if len(axes) == 1 and isinstance(axes[0], str) and "->" in axes[0]:
        return rearrange_spec(x, axes[0], **sizes)
    if sizes:
        raise TypeError(f"rearrange: sizes {sorted(sizes)} are only used with a 'lhs -> rhs' spec string")
    return shape_ops.rearrange_axes(x, axes)


def binary(x: NamedArray, other: Any, op: Callable[[Any, Any], Any], reverse: bool = False) -> NamedArray:
    """``op(x, other)`` broadcast by name (``op(other, x)`` when ``reverse``: the operator's right side)."""
    return broadcast.binary_op(op, other, x) if reverse else broadcast.binary_op(op, x, other)


METHODS: dict[str, Any] = {
    "rename": shape_ops.rename,
    "rearrange": rearrange,
    "broadcast_axis": broadcast.broadcast_axis,
    "unwrap": shape_ops.unwrap,
    "__getitem__": indexing.index,
    "at": property(indexing.AtIndexer),
    "sum": reductions.sum,
    "mean": reductions.mean,
    "max": reductions.max,
    "min": reductions.min,
    "_binary": binary,
}
"""Method name -> the function it is (its first argument is the array)."""

for _name, _method in METHODS.items():
    setattr(NamedArray, _name, _method)
