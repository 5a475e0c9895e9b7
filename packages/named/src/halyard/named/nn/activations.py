"""Activation functions on NamedArrays, and lookup by the names used in model configs."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from halyard.named.core import NamedArray

Activation = Callable[[NamedArray], NamedArray]


def _lift(fn: Callable[[jax.Array], jax.Array], name: str, doc: str) -> Activation:
    # The backward pass keeps only the input and recomputes the function: differentiating e.g. the tanh
    # GELU directly saves every intermediate (x**2, x**3, the tanh, ...), several [tokens, mlp] arrays per
    # layer written in the forward pass and read back in the backward one, for a few flops per element.
    recomputed = jax.checkpoint(fn)

    def activation_fn(x: NamedArray) -> NamedArray:
        if not isinstance(x, NamedArray):
            raise TypeError(f"{name} expects a NamedArray, got {type(x).__name__}")
        return NamedArray(recomputed(x.array), x.axes)

    activation_fn.__name__ = name
    activation_fn.__qualname__ = name
    activation_fn.__doc__ = doc
    return activation_fn


def _gelu_tanh(x: jax.Array) -> jax.Array:
    # The tanh approximation written out (as in GPT-2's "gelu_new"), so it does not depend on
    # which approximation a library's default uses.
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


relu = _lift(jax.nn.relu, "relu", "max(x, 0).")
relu_squared = _lift(lambda x: jnp.square(jax.nn.relu(x)), "relu_squared", "max(x, 0) ** 2 (Primer).")
gelu = _lift(
    lambda x: jax.nn.gelu(x, approximate=False), "gelu", "Exact GELU: x * Phi(x) with the normal CDF."
)
gelu_new = _lift(_gelu_tanh, "gelu_new", "GELU, tanh approximation (GPT-2's ``gelu_new``).")
quick_gelu = _lift(lambda x: x * jax.nn.sigmoid(1.702 * x), "quick_gelu", "x * sigmoid(1.702 x) (CLIP).")
silu = _lift(jax.nn.silu, "silu", "x * sigmoid(x), also called swish (Llama's MLP).")
sigmoid = _lift(jax.nn.sigmoid, "sigmoid", "1 / (1 + exp(-x)).")
tanh = _lift(jnp.tanh, "tanh", "Hyperbolic tangent.")
identity = _lift(lambda x: x, "identity", "x unchanged (a linear 'activation').")

ACTIVATIONS: dict[str, Activation] = {
    "relu": relu,
    "relu_squared": relu_squared,
    "squared_relu": relu_squared,
    "gelu": gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": gelu_new,
    "quick_gelu": quick_gelu,
    "silu": silu,
    "swish": silu,
    "sigmoid": sigmoid,
    "tanh": tanh,
    "identity": identity,
    "linear": identity,
}
"""Names (as Hugging Face configs spell them) to activation functions."""


def activation(name: str) -> Activation:
    """The activation function called ``name`` (e.g. ``"silu"``, ``"gelu_new"``); see `ACTIVATIONS`.

    Raises:
        ValueError: unknown name; the message lists the known names and the closest match.
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        close = difflib.get_close_matches(name, ACTIVATIONS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown activation {name!r}.{hint} Known: {sorted(ACTIVATIONS)}") from None
