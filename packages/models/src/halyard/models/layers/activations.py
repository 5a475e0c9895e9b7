"""Activation functions by the names model configs use (the Hugging Face ``hidden_act`` names)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp

from halyard.named import NamedArray


def _squared_relu(x: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(x))


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "squared_relu": _squared_relu,
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
