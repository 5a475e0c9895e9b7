"""Activation functions by the names model configs use (the Hugging Face ``hidden_act`` names)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp

from halyard.named import NamedArray


def _squared_relu(x: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(x))


def _recomputed(function: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """``function`` whose backward pass keeps only its input and recomputes the rest.

    Differentiating ``x * tanh(c * (x + 0.044715 * x**3))`` directly saves every intermediate (x**2,
    x**3, the tanh, ...) for the backward pass: six ``[tokens, mlp]`` arrays per layer for GPT-2's
    MLP, written in the forward pass and read back in the backward one. Recomputing an elementwise
    function inside the backward kernel costs a few flops per element and saves that memory traffic.
    """
    return jax.checkpoint(function)


_FORMULAS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "squared_relu": _squared_relu,
}
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    name: _recomputed(function) for name, function in _FORMULAS.items()
}


def check_activation(name: str, owner: str) -> None:
    """Raise a ValueError naming ``owner`` (e.g. ``LlamaConfig.activation``) when ``name`` is unknown."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"{owner}={name!r} is not a known activation; choose one of {', '.join(sorted(ACTIVATIONS))}"
        )


def activation(name: str, x: NamedArray) -> NamedArray:
    """Apply the activation called ``name`` elementwise to ``x`` (axes kept).

    Raises:
        ValueError: unknown name.
    """
    check_activation(name, "activation")
    return NamedArray(ACTIVATIONS[name](x.array), x.axes)
