"""Contractions by name: `dot` and `einsum`."""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.broadcast import union_axes
from halyard.named.core import NamedArray

_LETTERS = string.ascii_letters


def dot(
    *arrays: NamedArray,
    axis: AxisSelector | Sequence[AxisSelector] | None,
    out_axes: Sequence[AxisSelector] | None = None,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> NamedArray:
    """Multiply ``arrays`` elementwise by name and sum over ``axis``.

    Shared names that are not contracted are batch axes (kept once); names found in one array
    only are kept. ``dot(x[batch, embed], w[embed, mlp], axis="embed")`` has axes ``(batch, mlp)``.

    Args:
        arrays: the operands (two or more; one is allowed and then just sums).
        axis: the name(s) to contract; ``()`` contracts nothing (an outer/batched product); ``None``
            contracts every axis (a full inner product).
        out_axes: the order of the result's axes (default: first appearance across operands).
        precision, preferred_element_type: passed to XLA's dot.

    Raises:
        ValueError: a contracted name is in no operand, or one name has two sizes (both operands'
            axes are printed).
    """
    if not arrays:
        raise ValueError("dot needs at least one array")
    all_axes = union_axes(*arrays)
    if axis is None:
        contracted = {a.name for a in all_axes}
    else:
        selection = (axis,) if isinstance(axis, Axis | str) else tuple(axis)
        contracted = {axis_name(a) for a in selection}
        known = {a.name for a in all_axes}
        for name in contracted:
            if name not in known:
                raise ValueError(
                    f"dot: axis {name!r} is in none of the operands "
                    + ", ".join(format_axes(a.axes) for a in arrays)
                )
    kept = [a for a in all_axes if a.name not in contracted]
    if out_axes is not None:
        by_name = {a.name: a for a in kept}
        order = [axis_name(a) for a in out_axes]
        if sorted(order) != sorted(by_name):
            raise ValueError(f"dot: out_axes {order} must list exactly the result axes {sorted(by_name)}")
        kept = [by_name[n] for n in order]
    return _einsum_by_names(arrays, kept, all_axes, precision, preferred_element_type)


def _einsum_by_names(
    arrays: Sequence[NamedArray],
    out: Sequence[Axis],
    all_axes: Sequence[Axis],
    precision: Any,
    preferred_element_type: Any,
) -> NamedArray:
    if len(all_axes) > len(_LETTERS):
        raise ValueError(f"Too many distinct axes ({len(all_axes)}) for one contraction")
    letter = {a.name: _LETTERS[i] for i, a in enumerate(all_axes)}
    inputs = ",".join("".join(letter[a.name] for a in arr.axes) for arr in arrays)
    spec = inputs + "->" + "".join(letter[a.name] for a in out)
    result = jnp.einsum(
        spec,
        *(a.array for a in arrays),
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    return NamedArray(result, tuple(out))


def einsum(
    spec: str, *arrays: NamedArray, precision: Any = None, preferred_element_type: Any = None
) -> NamedArray:
    """Einstein summation over axis names: ``einsum("batch embed, embed vocab -> batch vocab", x, w)``.

    Each operand's term lists its axis names (in any order: operands are matched by name, not
    position). Names absent from the output are summed over. The output term fixes the result's order.

    Raises:
        ValueError: the number of terms differs from the number of operands, a term's names differ
            from its operand's axes, or an output name is in no input.
    """
    if "->" not in spec:
        raise ValueError(f"einsum spec {spec!r} needs '->' followed by the output axes")
    lhs, rhs = spec.split("->")
    terms = [t.split() for t in lhs.split(",")]
    if len(terms) != len(arrays):
        raise ValueError(
            f"einsum spec {spec!r} has {len(terms)} input terms but {len(arrays)} arrays were given"
        )
    for i, (term, arr) in enumerate(zip(terms, arrays)):
        if sorted(term) != sorted(arr.axis_names) or len(set(term)) != len(term):
            raise ValueError(
                f"einsum term {i} ({' '.join(term)!r}) does not name exactly the axes of operand {i} "
                f"{format_axes(arr.axes)}"
            )
    all_axes = union_axes(*arrays)
    by_name = {a.name: a for a in all_axes}
    out_names = rhs.split()
    for name in out_names:
        if name not in by_name:
            raise ValueError(f"einsum output axis {name!r} is in none of the inputs {sorted(by_name)}")
    if len(set(out_names)) != len(out_names):
        raise ValueError(f"einsum output {rhs!r} repeats an axis")
    return _einsum_by_names(
        arrays, [by_name[n] for n in out_names], all_axes, precision, preferred_element_type
    )
