"""Elementwise functions on NamedArrays (broadcasting by name, see `halyard.named.broadcast`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.broadcast import elementwise
from halyard.named.core import NamedArray


def _unary(fn: Callable[..., Any], doc: str) -> Callable[..., Any]:
    def op(x: Any, **kwargs: Any) -> Any:
        if isinstance(x, NamedArray):
            return NamedArray(fn(x.array, **kwargs), x.axes)
        return fn(x, **kwargs)

    op.__name__ = fn.__name__
    op.__doc__ = doc
    return op


def _binary(fn: Callable[..., Any], doc: str) -> Callable[..., Any]:
    def op(a: Any, b: Any) -> Any:
        return elementwise(fn, a, b)

    op.__name__ = fn.__name__
    op.__doc__ = doc
    return op


abs = _unary(jnp.abs, "|x|")
exp = _unary(jnp.exp, "e**x")
expm1 = _unary(jnp.expm1, "e**x - 1")
log = _unary(jnp.log, "natural logarithm")
log1p = _unary(jnp.log1p, "log(1 + x)")
sqrt = _unary(jnp.sqrt, "square root")
rsqrt = _unary(lambda x: 1.0 / jnp.sqrt(x), "1 / sqrt(x)")
square = _unary(jnp.square, "x * x")
sin = _unary(jnp.sin, "sine")
cos = _unary(jnp.cos, "cosine")
tanh = _unary(jnp.tanh, "hyperbolic tangent")
sign = _unary(jnp.sign, "sign")
floor = _unary(jnp.floor, "floor")
ceil = _unary(jnp.ceil, "ceiling")
round = _unary(jnp.round, "round half to even")
isnan = _unary(jnp.isnan, "x is NaN")
isfinite = _unary(jnp.isfinite, "x is neither inf nor NaN")
logical_not = _unary(jnp.logical_not, "not x")
reciprocal = _unary(jnp.reciprocal, "1 / x")
stop_gradient = _unary(jax.lax.stop_gradient, "x, with a zero gradient (jax.lax.stop_gradient)")

maximum = _binary(jnp.maximum, "elementwise maximum, broadcasting by name")
minimum = _binary(jnp.minimum, "elementwise minimum, broadcasting by name")
logical_and = _binary(jnp.logical_and, "a and b, broadcasting by name")
logical_or = _binary(jnp.logical_or, "a or b, broadcasting by name")
power = _binary(jnp.power, "a ** b, broadcasting by name")


def where(condition: Any, x: Any, y: Any) -> Any:
    """``x`` where ``condition`` holds, else ``y``; all three broadcast by name."""
    return elementwise(jnp.where, condition, x, y)


def clip(x: Any, lower: Any = None, upper: Any = None) -> Any:
    """``x`` limited to ``[lower, upper]`` (either may be None); bounds broadcast by name."""
    if lower is not None:
        x = maximum(x, lower)
    if upper is not None:
        x = minimum(x, upper)
    return x
