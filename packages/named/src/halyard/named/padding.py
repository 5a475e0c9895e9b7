"""Moving entries along named axes: `pad`, `roll`, `flip`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name
from halyard.named.core import NamedArray


def pad(
    x: NamedArray,
    widths: Mapping[AxisSelector, int | tuple[int, int]],
    *,
    mode: str = "constant",
    constant_value: Any = 0,
) -> NamedArray:
    """Pad axes by name: ``pad(x, {"pos": (0, 3)})`` adds 3 entries at the end of ``pos``.

    Args:
        x: the array.
        widths: ``{axis: (before, after)}``, or ``{axis: n}`` for ``(n, n)``; axes not listed are unchanged.
        mode: a ``jnp.pad`` mode (``"constant"``, ``"edge"``, ``"reflect"``, ``"wrap"``, ...).
        constant_value: the fill value for ``mode="constant"``.

    Raises:
        KeyError: an axis is not in ``x``.
        ValueError: a width is negative.
    """
    per_axis = [(0, 0)] * x.ndim
    for key, width in widths.items():
        index = x.axis_index(key)
        before, after = (width, width) if isinstance(width, int) else tuple(width)
        if before < 0 or after < 0:
            raise ValueError(f"pad: widths must be >= 0, got {width!r} for axis {axis_name(key)!r}")
        per_axis[index] = (before, after)
    kwargs = {"constant_values": constant_value} if mode == "constant" else {}
    data = jnp.pad(x.array, per_axis, mode=mode, **kwargs)
    axes = tuple(Axis(a.name, a.size + b + e) for a, (b, e) in zip(x.axes, per_axis))
    return NamedArray(data, axes)


def roll(x: NamedArray, shift: Any, axis: AxisSelector) -> NamedArray:
    """Shift entries along ``axis`` by ``shift`` positions (may be traced), wrapping around the end."""
    return NamedArray(jnp.roll(x.array, shift, axis=x.axis_index(axis)), x.axes)


def flip(x: NamedArray, axis: AxisSelector) -> NamedArray:
    """Reverse the order of entries along ``axis``."""
    return NamedArray(jnp.flip(x.array, axis=x.axis_index(axis)), x.axes)
