"""Activations: the Hugging Face formulas, and a backward pass that keeps only the input."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import named
from halyard.named.nn import ACTIVATIONS

X = jnp.linspace(-4.0, 4.0, 96, dtype=jnp.float32).reshape(8, 12)
PLAIN = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": lambda x: 0.5 * x * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "relu": jax.nn.relu,
    "squared_relu": lambda x: jnp.maximum(x, 0) ** 2,
}


def _plain_array(name: str):  # the registry's function on a plain array, through a NamedArray
    return lambda x: ACTIVATIONS[name](named(x, ("pos", "mlp"))).array


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_values_and_gradients_equal_the_plain_formula(name: str) -> None:
    got, got_grad = jax.value_and_grad(lambda x: jnp.sum(_plain_array(name)(x) * X))(X)
    want, want_grad = jax.value_and_grad(lambda x: jnp.sum(PLAIN[name](x) * X))(X)
    # The same formula, rematerialized or not: XLA may fuse, and so round, each of its ~8 operations and one
    # function (tanh, erf, the logistic) differently. An activation's terms are at most |x| in size (1 + tanh
    # and 1 - sigmoid cancel for negative x; relu's square at most 4 |x| here), the derivative's at most
    # 1 + x^2; the value sums the 96 products f(x) * x, all >= 0.
    x = np.asarray(X, np.float64)
    sizes = np.abs(x) * np.maximum(np.abs(x), np.abs(np.asarray(PLAIN[name](X))))
    np.testing.assert_allclose(
        got, want, atol=summation_tolerance(sizes.sum(), X.size + FUNCTION_TERMS + 8), rtol=0
    )
    bound = summation_tolerance(np.abs(x) * (1 + x**2), 2 * (FUNCTION_TERMS + 8))
    np.testing.assert_allclose(got_grad, want_grad, atol=bound, rtol=0)


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_backward_keeps_only_the_input(name: str) -> None:
    _, backward = jax.vjp(_plain_array(name), X)
    saved = [leaf for leaf in jax.tree.leaves(backward) if getattr(leaf, "shape", None) == X.shape]
    assert len(saved) == 1
    _, plain_backward = jax.vjp(PLAIN["gelu_new"], X)  # the un-recomputed formula keeps several
    assert (
        len([leaf for leaf in jax.tree.leaves(plain_backward) if getattr(leaf, "shape", None) == X.shape]) > 1
    )
