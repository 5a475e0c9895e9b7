"""The one broadcasting rule, against numpy on random axes in random orders."""

import operator

import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, numpy_aligned, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis

OPERATORS = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.lt,
    operator.ge,
    operator.eq,
]


def expected_axes(*operands) -> tuple[Axis, ...]:
    """Rule 3 spelled out: the first operand's axes, then each later operand's new axes in its order."""
    result: list[Axis] = []
    for x in operands:
        result.extend(a for a in x.axes if a not in result)
    return tuple(result)


@given(data=st.data(), pool=axis_pools(), seed=seeds, op=st.sampled_from(OPERATORS))
def test_binary_operators_broadcast_by_name(data, pool, seed, op):
    a = values(data.draw(subsets(pool)), seed)
    b = values(data.draw(subsets(pool)), seed + 1)
    out = op(a, b)
    axes = expected_axes(a, b)
    assert out.axes == axes
    # one IEEE operation on float32 values each, correctly rounded on both sides: bit for bit
    np.testing.assert_array_equal(out.array, op(numpy_aligned(a, axes), numpy_aligned(b, axes)))


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_where_broadcasts_three_operands(data, pool, seed):
    condition = values(data.draw(subsets(pool)), seed, "bool")
    x = values(data.draw(subsets(pool)), seed + 1)
    y = values(data.draw(subsets(pool)), seed + 2)
    out = hn.where(condition, x, y)
    axes = expected_axes(condition, x, y)
    assert out.axes == axes
    reference = np.where(numpy_aligned(condition, axes), numpy_aligned(x, axes), numpy_aligned(y, axes))
    np.testing.assert_array_equal(out.array, np.broadcast_to(reference, out.array.shape))


# Magnitudes well above float32's subnormal range, which XLA flushes to zero.
@given(
    data=st.data(),
    pool=axis_pools(),
    seed=seeds,
    scalar=st.just(0.0) | st.floats(1e-3, 3) | st.floats(-3, -1e-3),
)
def test_scalars_on_either_side(data, pool, seed, scalar):
    x = values(data.draw(subsets(pool)), seed)
    raw = np.asarray(x.array)
    # the scalar is taken as float32 (weakly typed): one correctly rounded operation, bit for bit
    np.testing.assert_array_equal((x - scalar).array, raw - np.float32(scalar))
    np.testing.assert_array_equal((scalar - x).array, np.float32(scalar) - raw)
    np.testing.assert_array_equal((jnp.float32(scalar) * x).array, np.float32(scalar) * raw)
    np.testing.assert_array_equal(hn.maximum(x, scalar).array, np.maximum(raw, np.float32(scalar)))
    assert (x + 1).axes == x.axes


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_broadcast_to_any_order_and_superset(data, pool, seed):
    x = values(data.draw(subsets(pool)), seed)
    target = data.draw(st.permutations(pool))
    out = hn.broadcast_to(x, target)
    assert out.axes == tuple(target)
    np.testing.assert_array_equal(
        out.array, np.broadcast_to(numpy_aligned(x, tuple(target)), out.array.shape)
    )


UNARY = [
    (hn.exp, np.exp),
    (hn.tanh, np.tanh),
    (hn.abs, np.abs),
    (hn.square, np.square),
    (hn.sin, np.sin),
    (hn.sign, np.sign),
    (lambda x: hn.log(hn.abs(x) + 1), lambda x: np.log(np.abs(x) + 1)),
    (lambda x: hn.sqrt(hn.abs(x)), lambda x: np.sqrt(np.abs(x))),
    (lambda x: hn.rsqrt(hn.abs(x) + 1), lambda x: 1 / np.sqrt(np.abs(x) + 1)),
    (lambda x: hn.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5)),
]


@pytest.mark.parametrize("fn, reference", UNARY)
@settings(max_examples=12)
@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_unary_functions_keep_axes(fn, reference, data, pool, seed):
    x = values(data.draw(subsets(pool)), seed)
    out = fn(x)
    assert out.axes == x.axes
    # XLA's and numpy's float32 functions on the same float32 input (|x| + 1 rounds alike): XLA's within
    # FUNCTION_TERMS eps of exact and numpy's within 1, relative; sin's range reduction is exact to an
    # absolute eps near its zeros, the rest are exact IEEE operations
    bound = summation_tolerance(1.0, FUNCTION_TERMS + 1)
    np.testing.assert_allclose(out.array, reference(np.asarray(x.array)), rtol=bound, atol=bound)


def test_gradients_through_broadcasting():
    Batch, Embed = Axis("batch", 3), Axis("embed", 4)
    x = values((Batch, Embed), 0)
    bias = values((Embed,), 1)

    def f(raw_x, raw_bias):
        out = hn.tanh(hn.named(raw_x, (Batch, Embed)) * hn.named(raw_bias, (Embed,)) - 0.5)
        return hn.where(out > 0, out, out * 0.1).array

    check_grads_jitted(f, (x.array, bias.array), order=2, modes=("fwd", "rev"))


def test_stop_gradient():
    import jax

    x = hn.named(jnp.array([1.0, 2.0]), ("embed",))
    grad = jax.grad(lambda v: (hn.stop_gradient(v) * v).sum().array)(x)
    np.testing.assert_array_equal(grad.array, [1.0, 2.0])  # d(c * v)/dv = c: no rounding
