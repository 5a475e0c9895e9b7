"""Private helpers shared by the layers: parameter initialisation by axes and axis-argument handling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named import random
from halyard.named.axis import Axis
from halyard.named.constructors import full
from halyard.named.core import NamedArray


def as_axes(spec: Axis | Sequence[Axis], what: str) -> tuple[Axis, ...]:
    """``spec`` as a tuple of `Axis` objects; layers need sizes, so plain names are refused.

    Raises:
        TypeError: an element is not an `Axis` (``what`` names the argument in the message).
    """
    axes = (spec,) if isinstance(spec, Axis) else tuple(spec)
    for axis in axes:
        if not isinstance(axis, Axis):
            raise TypeError(
                f"{what} must be an Axis or a tuple of Axis objects (layers need sizes), got {axis!r}; "
                f"write e.g. Axis('embed', 512)"
            )
    return axes


def normal(key: jax.Array, axes: Sequence[Axis], std: float, dtype: Any) -> NamedArray:
    """A NamedArray over ``axes`` drawn from N(0, std**2)."""
    return (random.normal(key, tuple(axes), jnp.float32) * std).astype(dtype)


def constant(axes: Sequence[Axis], value: float, dtype: Any) -> NamedArray:
    """A NamedArray over ``axes`` filled with ``value``."""
    return full(tuple(axes), value, dtype)


def fan_in(axes: Sequence[Axis]) -> int:
    size = 1
    for axis in axes:
        size *= axis.size
    return size
