"""Reductions by name, with and without ``where=``, against numpy on random axes and orders."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, numpy_aligned, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis


def _np_logsumexp(x, axis, where=None):
    if where is None:
        where = np.ones_like(x, bool)
    peak = np.max(x, axis=axis, where=where, initial=-np.inf, keepdims=True)
    total = np.sum(np.exp(x - peak), axis=axis, where=where, keepdims=True)
    return np.squeeze(np.log(total) + peak, axis=axis)


REDUCTIONS = {
    "sum": (hn.sum, lambda x, axis, where: np.sum(x, axis=axis, where=where)),
    "mean": (hn.mean, lambda x, axis, where: np.mean(x, axis=axis, where=where)),
    "max": (hn.max, lambda x, axis, where: np.max(x, axis=axis, where=where, initial=-np.inf)),
    "min": (hn.min, lambda x, axis, where: np.min(x, axis=axis, where=where, initial=np.inf)),
    "prod": (hn.prod, lambda x, axis, where: np.prod(x, axis=axis, where=where)),
    "var": (hn.var, lambda x, axis, where: np.var(x, axis=axis, where=where)),
    "std": (hn.std, lambda x, axis, where: np.std(x, axis=axis, where=where)),
    "logsumexp": (hn.logsumexp, lambda x, axis, where: _np_logsumexp(x, axis, where)),
}


def _bound(name, x, axis, where):
    """How far float32 may be from numpy's float64 ``name`` of ``x`` over ``axis``: the reduced count of terms
    (and a function) at the size of the addends, which cancel (a sum of both signs); max and min are exact."""
    count = int(np.max(np.sum(np.broadcast_to(where, x.shape), axis=axis)))
    terms = count + FUNCTION_TERMS
    if name in ("max", "min"):
        return 0.0
    if name in ("sum", "mean", "prod"):
        return summation_tolerance(REDUCTIONS[name][1](np.abs(x), axis, where), terms)
    if name == "logsumexp":
        return summation_tolerance(np.max(np.abs(x)) + np.log(count), terms)
    variance = summation_tolerance(np.mean(x**2, axis=axis, where=where) * 2, terms)  # E[x^2] and mean^2
    if name == "var":
        return variance
    std = np.std(x, axis=axis, where=where)
    return float(np.max(np.where(std > 0, variance / (2 * np.where(std > 0, std, 1)), np.sqrt(variance))))


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@settings(max_examples=12)
@given(data=st.data(), pool=axis_pools(), seed=seeds, masked=st.booleans())
def test_reductions_match_numpy(name, data, pool, seed, masked):
    fn, reference = REDUCTIONS[name]
    x = values(data.draw(st.permutations(pool)), seed)
    reduced = data.draw(subsets(x.axes, min_size=1))
    selector = data.draw(st.sampled_from(["names", "axes"]))
    axis_arg = tuple(a.name for a in reduced) if selector == "names" else reduced
    if len(axis_arg) == 1 and data.draw(st.booleans()):
        axis_arg = axis_arg[0]  # a single name (or Axis), not a tuple
    where = None
    raw_where = None
    if masked:
        # The mask has some of x's axes in its own order; it broadcasts by name.
        where = values(data.draw(subsets(x.axes)), seed + 1, "bool")
        for axis in reduced:  # keep the first element of every slice so that every result is defined
            where = where | (hn.arange(axis) == 0)
        raw_where = np.broadcast_to(numpy_aligned(where, x.axes), x.array.shape)
    out = fn(x, axis_arg, where=where)
    positions = tuple(x.axis_names.index(a.name) for a in reduced)
    assert out.axes == tuple(a for a in x.axes if a not in reduced)
    raw = np.asarray(x.array, np.float64)
    expected = reference(raw, positions, raw_where if masked else True)
    bound = _bound(name, raw, positions, raw_where if masked else True)
    np.testing.assert_allclose(out.array, expected, atol=bound, rtol=0)


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_reduce_everything_and_methods(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    raw = np.asarray(x.array)
    assert hn.sum(x).axes == ()
    bound = summation_tolerance(np.abs(raw).sum(), raw.size)  # the addends' size: they cancel
    np.testing.assert_allclose(hn.sum(x).array, raw.sum(), atol=bound, rtol=0)
    name = data.draw(st.sampled_from(x.axis_names))
    index = x.axis_names.index(name)
    bound = summation_tolerance(np.abs(raw).mean(axis=index), raw.shape[index] + 1)  # + the division
    np.testing.assert_allclose(x.mean(name).array, raw.mean(axis=index), atol=bound, rtol=0)
    np.testing.assert_array_equal(x.max(name).array, raw.max(axis=x.axis_names.index(name)))  # exact
    np.testing.assert_array_equal(x.min().array, raw.min())


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_any_all(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed, "bool")
    name = data.draw(st.sampled_from(x.axis_names))
    index = x.axis_names.index(name)
    np.testing.assert_array_equal(hn.any(x, name).array, np.asarray(x.array).any(axis=index))
    np.testing.assert_array_equal(hn.all(x, name).array, np.asarray(x.array).all(axis=index))


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_argmax_argmin(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    name = data.draw(st.sampled_from(x.axis_names))
    index = x.axis_names.index(name)
    raw = np.asarray(x.array)
    out = hn.argmax(x, name)
    assert out.axes == tuple(a for a in x.axes if a.name != name)
    np.testing.assert_array_equal(out.array, raw.argmax(axis=index))
    np.testing.assert_array_equal(hn.argmin(x, name).array, raw.argmin(axis=index))
    assert int(hn.argmax(x, None).array) == int(raw.argmax())


def test_where_must_be_named():
    x = values((Axis("batch", 2), Axis("embed", 3)), 0)
    with pytest.raises(TypeError, match="no axis names"):
        hn.sum(x, "embed", where=jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match="'vocab' is not in the target"):
        hn.sum(x, "embed", where=hn.ones(Axis("vocab", 3), bool))


def test_max_with_all_masked_slice_gives_initial():
    x = values((Axis("batch", 2), Axis("embed", 3)), 0)
    keep = hn.named(jnp.array([True, False]), ("batch",))
    out = hn.max(x, "embed", where=keep)
    assert np.isneginf(np.asarray(out.array)[1])


@pytest.mark.parametrize("name", ["sum", "mean", "max", "var", "logsumexp"])
def test_reduction_gradients(name):
    fn = REDUCTIONS[name][0]
    axes = (Axis("batch", 2), Axis("pos", 3), Axis("embed", 4))
    x = values(axes, 3)
    keep = hn.named(jnp.array([True, True, False]), ("pos",))
    check_grads_jitted(lambda raw: fn(hn.named(raw, axes), ("pos", "embed")).array, (x.array,))
    check_grads_jitted(lambda raw: fn(hn.named(raw, axes), "pos", where=keep).array, (x.array,))


def test_reductions_under_jit_and_vmap():
    axes = (Axis("batch", 2), Axis("embed", 4))
    x = values(axes, 1)
    out = jax.jit(lambda v: hn.logsumexp(v, "embed"))(x)
    expected = jax.nn.logsumexp(x.array, axis=1)  # another program: its own order of the 4 terms
    bound = summation_tolerance(np.abs(x.array).max() + np.log(4), 4 + 2 * FUNCTION_TERMS)
    np.testing.assert_allclose(out.array, expected, atol=bound, rtol=0)
    per_row = hn.vmap(lambda row: hn.mean(row, "embed"), "batch")(x)
    bound = summation_tolerance(np.abs(np.asarray(x.array)).mean(axis=1), 4 + 1)
    np.testing.assert_allclose(per_row.array, np.asarray(x.array).mean(axis=1), atol=bound, rtol=0)
