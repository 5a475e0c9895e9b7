"""`rearrange`: split, merge and transpose axes by name with an einops-like grammar.

``rearrange(x, "batch pos (embed: heads head_size) -> batch heads pos head_size", heads=8)``

The grammar, one side of ``->`` each:

- **Left** lists the input's axes by name, in *any* order (they are matched by name, never by
  position). ``(embed: heads head_size)`` splits the input axis ``embed`` into new axes ``heads`` and
  ``head_size`` (in that order, row-major); the sizes of the parts are keyword arguments, and one
  part may be left out and inferred. ``...`` stands for every axis not named; without it, every axis
  must be named.
- **Right** gives the result's order. ``(qkv: heads head_size)`` merges axes into a new axis ``qkv``
  (row-major, the first part varies slowest); a group with one part renames it. ``...`` stands for
  every remaining axis in the input's order; without it, every axis must appear.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from halyard.named.axis import Axis, format_axes
from halyard.named.core import NamedArray

_TOKEN = re.compile(r"\(\s*([A-Za-z_][\w]*)\s*:([^()]*)\)|\.\.\.|[A-Za-z_][\w]*|(\S)")


@dataclass(frozen=True)
class _Group:
    name: str
    parts: tuple[str, ...]


def _parse_side(text: str, spec: str) -> list[Any]:
    elements: list[Any] = []
    for match in _TOKEN.finditer(text):
        if match.group(3) is not None:
            raise ValueError(
                f"rearrange spec {spec!r}: unexpected {match.group(3)!r}; write axis names, '...', "
                f"and groups such as '(embed: heads head_size)'"
            )
        token = match.group(0)
        if match.group(1) is not None:
            parts = tuple(match.group(2).split())
            if not parts or not all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in parts):
                raise ValueError(
                    f"rearrange spec {spec!r}: group {token!r} needs one or more axis names after ':'"
                )
            elements.append(_Group(match.group(1), parts))
        elif token == "...":
            elements.append(Ellipsis)
        else:
            elements.append(token)
    if elements.count(Ellipsis) > 1:
        raise ValueError(f"rearrange spec {spec!r}: at most one '...' per side")
    return elements


def _check_unique(names: list[str], where: str, spec: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"rearrange spec {spec!r}: axis {name!r} appears twice on the {where}")
        seen.add(name)


def _split_sizes(group: _Group, total: int, sizes: dict[str, int], spec: str) -> list[Axis]:
    unknown = [p for p in group.parts if p not in sizes]
    if len(unknown) > 1:
        raise ValueError(
            f"rearrange spec {spec!r}: splitting {group.name!r} (size {total}) needs the sizes of all but one "
            f"of {list(group.parts)}; pass e.g. {unknown[0]}=... as a keyword"
        )
    known = math.prod(sizes[p] for p in group.parts if p in sizes)
    if unknown:
        if known == 0 or total % known:
            raise ValueError(
                f"rearrange spec {spec!r}: axis {group.name!r} of size {total} does not divide into "
                f"{ {p: sizes[p] for p in group.parts if p in sizes} } times a whole number"
            )
        inferred = {unknown[0]: total // known}
    else:
        inferred = {}
        if known != total:
            raise ValueError(
                f"rearrange spec {spec!r}: axis {group.name!r} has size {total}, but the parts "
                f"{ {p: sizes[p] for p in group.parts} } multiply to {known}"
            )
    return [Axis(p, sizes[p] if p in sizes else inferred[p]) for p in group.parts]


def rearrange(x: NamedArray, spec: str, **sizes: int) -> NamedArray:
    """Split, merge and transpose the axes of ``x`` as ``spec`` says (see the module docstring).

    Args:
        x: the array.
        spec: ``"<input axes> -> <output axes>"``, e.g. ``"... (embed: heads head_size) -> ... heads head_size"``.
        sizes: sizes of the parts of split axes, by name (``heads=8``); one part per split may be omitted.

    Raises:
        ValueError: a malformed spec, an axis named twice, left out without ``...``, a part size that does
            not divide, or a keyword size that the spec does not use. Messages print ``x``'s axes.
        KeyError: the left side names an axis ``x`` does not have.
    """
    if spec.count("->") != 1:
        raise ValueError(f"rearrange spec {spec!r} needs exactly one '->' between input and output axes")
    left_text, right_text = spec.split("->")
    left, right = _parse_side(left_text, spec), _parse_side(right_text, spec)
    context = f"{spec!r} on {format_axes(x.axes)}"

    # Left side: which input axes are named, which are split.
    left_names = [e.name if isinstance(e, _Group) else e for e in left if e is not Ellipsis]
    _check_unique(left_names, "left", spec)
    for name in left_names:
        if not x.has_axis(name):
            raise KeyError(
                f"rearrange {context}: the left side names {name!r}, which is not an axis of the input"
            )
    if Ellipsis not in left and len(left_names) != x.ndim:
        missing = [a.name for a in x.axes if a.name not in left_names]
        raise ValueError(f"rearrange {context}: the left side leaves out {missing}; name them or add '...'")
    used_sizes: set[str] = set()
    splits: dict[str, list[Axis]] = {}
    for element in left:
        if isinstance(element, _Group):
            splits[element.name] = _split_sizes(element, x.axis_size(element.name), sizes, spec)
            used_sizes.update(p for p in element.parts if p in sizes)
    unused = sorted(set(sizes) - used_sizes)
    if unused:
        raise ValueError(f"rearrange {context}: sizes {unused} are given but no split on the left uses them")

    # The input with its split axes expanded in place.
    expanded: list[Axis] = []
    for axis in x.axes:
        expanded.extend(splits.get(axis.name, [axis]))
    _check_unique([a.name for a in expanded], "left after splitting", spec)
    by_name = {a.name: a for a in expanded}
    data = jnp.reshape(x.array, tuple(a.size for a in expanded)) if splits else x.array

    # Right side: order, merges.
    right_parts: list[str] = []
    for element in right:
        if isinstance(element, _Group):
            right_parts.extend(element.parts)
        elif element is not Ellipsis:
            right_parts.append(element)
    _check_unique(right_parts, "right", spec)
    for name in right_parts:
        if name not in by_name:
            raise ValueError(
                f"rearrange {context}: the right side names {name!r}, which is neither an input axis nor a "
                f"part of a split on the left (available: {list(by_name)})"
            )
    rest = [a.name for a in expanded if a.name not in right_parts]
    if Ellipsis not in right and rest:
        raise ValueError(f"rearrange {context}: the right side leaves out {rest}; name them or add '...'")
    flat_order: list[str] = []
    out_axes: list[Axis] = []
    for element in right:
        if element is Ellipsis:
            flat_order.extend(rest)
            out_axes.extend(by_name[n] for n in rest)
        elif isinstance(element, _Group):
            flat_order.extend(element.parts)
            out_axes.append(Axis(element.name, math.prod(by_name[p].size for p in element.parts)))
        else:
            flat_order.append(element)
            out_axes.append(by_name[element])
    permutation = [next(i for i, a in enumerate(expanded) if a.name == n) for n in flat_order]
    if permutation != list(range(len(permutation))):
        data = jnp.transpose(data, permutation)
    return NamedArray(jnp.reshape(data, tuple(a.size for a in out_axes)), tuple(out_axes))
