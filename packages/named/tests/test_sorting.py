"""sort / argsort / top_k and cumulative ops along a named axis, against numpy."""

import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import summation_tolerance
from hypothesis import given
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, seeds, values

import halyard.named as hn
from halyard.named import Axis


@given(data=st.data(), pool=axis_pools(), seed=seeds, descending=st.booleans())
def test_sort_and_argsort(data, pool, seed, descending):
    x = values(data.draw(st.permutations(pool)), seed, data.draw(st.sampled_from(["float32", "int32"])))
    axis = data.draw(st.sampled_from(x.axis_names))
    k = x.axis_names.index(axis)
    raw = np.asarray(x.array)
    expected_order = np.argsort(-raw if descending else raw, axis=k, kind="stable")
    out = hn.sort(x, axis, descending=descending)
    assert out.axes == x.axes
    np.testing.assert_array_equal(out.array, np.take_along_axis(raw, expected_order, axis=k))
    if not descending:  # stable descending order differs between libraries only on ties; check values
        np.testing.assert_array_equal(hn.argsort(x, axis).array, expected_order)
    order = hn.argsort(x, axis, descending=descending)
    np.testing.assert_array_equal(np.take_along_axis(raw, np.asarray(order.array), axis=k), out.array)


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_top_k(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axes))
    k = data.draw(st.integers(0, axis.size))
    new_name = data.draw(st.sampled_from([None, "top"]))
    top_values, top_indices = hn.top_k(x, axis.name, k, new_name)
    position = x.axes.index(axis)
    new_axis = Axis(new_name or axis.name, k)
    assert top_values.axes == x.axes[:position] + (new_axis,) + x.axes[position + 1 :]
    assert top_indices.axes == top_values.axes
    raw = np.asarray(x.array)
    expected = np.take(-np.sort(-raw, axis=position), np.arange(k), axis=position)
    np.testing.assert_array_equal(top_values.array, expected)
    np.testing.assert_array_equal(
        np.take_along_axis(raw, np.asarray(top_indices.array), axis=position), expected
    )


CUMULATIVE = [
    (hn.cumsum, np.cumsum),
    (hn.cumprod, np.cumprod),
    (hn.cummax, np.maximum.accumulate),
    (hn.cummin, np.minimum.accumulate),
]


@pytest.mark.parametrize("fn, reference", CUMULATIVE)
@given(data=st.data(), pool=axis_pools(), seed=seeds, reverse=st.booleans())
def test_cumulative(fn, reference, data, pool, seed, reverse):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axis_names))
    k = x.axis_names.index(axis)
    raw = np.asarray(x.array, np.float64)
    if reverse:
        expected = np.flip(reference(np.flip(raw, k), axis=k), k)
    else:
        expected = reference(raw, axis=k)
    out = fn(x, axis, reverse=reverse)
    assert out.axes == x.axes
    n = x.axis(axis).size
    if fn is hn.cumsum:  # float32 against float64: n addends, at their size (they cancel)
        bound = summation_tolerance(np.abs(raw).sum(axis=k), n)
        np.testing.assert_allclose(out.array, expected, atol=bound, rtol=0)
    elif fn is hn.cumprod:  # n products: relative, entry by entry
        np.testing.assert_allclose(out.array, expected, rtol=summation_tolerance(1.0, n), atol=0)
    else:  # a running max or min picks one of the inputs
        np.testing.assert_array_equal(out.array, expected)


def test_top_k_errors():
    x = values((Axis("batch", 2), Axis("experts", 4)), 0)
    with pytest.raises(ValueError, match="k=5 is out of range for axis 'experts' of size 4"):
        hn.top_k(x, "experts", 5)
    with pytest.raises(ValueError, match="new axis 'batch' clashes"):
        hn.top_k(x, "experts", 2, "batch")


def test_gradients():
    axes = (Axis("batch", 2), Axis("experts", 4))
    x = hn.named(jnp.array([[0.1, 0.9, -0.4, 0.3], [1.2, -0.7, 0.5, 0.0]]), axes)

    def f(raw):
        v = hn.named(raw, axes)
        top, _ = hn.top_k(v, "experts", 2, "chosen")
        return (hn.cumsum(v, "experts") + hn.sort(v, "experts")).sum("batch").array, top.array

    check_grads_jitted(f, (x.array,), order=1, modes=("fwd", "rev"))
