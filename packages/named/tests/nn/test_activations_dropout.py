"""Activations against closed-form numpy references; Dropout's statistics and switches."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, named
from halyard.named.nn import ACTIVATIONS, Dropout, activation

X = np.linspace(-4.0, 4.0, 33, dtype=np.float32)
_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


REFERENCES = {
    "relu": lambda x: np.maximum(x, 0),
    "relu_squared": lambda x: np.maximum(x, 0) ** 2,
    "squared_relu": lambda x: np.maximum(x, 0) ** 2,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "quick_gelu": lambda x: x * _sigmoid(1.702 * x),
    "silu": lambda x: x * _sigmoid(x),
    "swish": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "identity": lambda x: x,
    "linear": lambda x: x,
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_numpy(name):
    x = named(X, ("pos",))
    y = activation(name)(x)
    assert y.axes == x.axes
    expected = REFERENCES[name](X.astype(np.float64))
    # float32 against float64: up to ~8 roundings of the function's argument (gelu_new's cube, constants,
    # products and sum; a slope at most 1 after them) and the function's own (erf's 2.6 eps, tanh's 3.2),
    # absolute at the size of x or of the value (1 + tanh and 1 - sigmoid cancel for negative x)
    bound = summation_tolerance(np.maximum(np.abs(X), np.abs(expected)), FUNCTION_TERMS + 8)
    np.testing.assert_allclose(np.asarray(y.array), expected, atol=bound, rtol=0)


def test_gelu_new_differs_from_exact_gelu():
    x = named(X, ("pos",))
    assert float(jnp.max(jnp.abs(activation("gelu")(x).array - activation("gelu_new")(x).array))) > 1e-4


def test_activation_unknown_name_suggests():
    with pytest.raises(ValueError, match="Did you mean 'silu'"):
        activation("siluu")
    with pytest.raises(TypeError, match="NamedArray"):
        activation("relu")(jnp.ones(3))


def test_dropout_keeps_expected_fraction_and_rescales():
    x = named(jnp.ones((64, 128)), ("batch", "embed"))
    y = Dropout(0.25)(x, key=jax.random.PRNGKey(0))
    values = np.asarray(y.array)
    kept = values[values != 0]
    np.testing.assert_array_equal(kept, np.float32(1 / 0.75))  # 1 times 1 / (1 - rate) rounded to float32
    assert abs((values == 0).mean() - 0.25) < 0.02
    assert abs(values.mean() - 1.0) < 0.03


def test_dropout_inference_and_zero_rate_are_identity():
    x = named(jax.random.normal(jax.random.PRNGKey(1), (4, 8)), ("batch", "embed"))
    assert Dropout(0.5, inference=True)(x) is x
    assert Dropout(0.5)(x, inference=True) is x
    assert Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="no key"):
        Dropout(0.5)(x)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)


def test_dropout_broadcast_axes_share_one_mask():
    x = named(jnp.ones((6, 5, 40)), ("batch", "pos", "embed"))
    y = Dropout(0.5, broadcast_axes=("pos",))(x, key=jax.random.PRNGKey(2))
    values = np.asarray(y.array)
    assert (values == values[:, :1, :]).all()
    assert 0 < (values == 0).mean() < 1


def test_dropout_under_jit_with_axis_order_kept():
    x = named(jnp.ones((3, 4)), (Axis("embed", 3), Axis("batch", 4)))
    y = jax.jit(lambda x, k: Dropout(0.5)(x, key=k))(x, jax.random.PRNGKey(3))
    assert y.axis_names == ("embed", "batch")
