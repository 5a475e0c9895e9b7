"""softmax / log_softmax against jax.nn on the raw arrays, with and without masks."""

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

Batch, Pos, Vocab = Axis("batch", 3), Axis("pos", 4), Axis("vocab", 5)


def logits() -> hn.NamedArray:
    return hn.random.normal(jax.random.key(0), (Batch, Pos, Vocab))


@pytest.mark.parametrize(
    "fn, reference", [(hn.softmax, jax.nn.softmax), (hn.log_softmax, jax.nn.log_softmax)]
)
def test_matches_jax_over_each_axis(fn, reference):
    x = logits()
    for position, name in enumerate(x.axis_names):
        out = fn(x, name)
        assert out.axes == x.axes
        # unmasked, the named functions call jax.nn's on the same array and axis: the same program
        np.testing.assert_array_equal(out.array, reference(x.array, axis=position))


def test_softmax_over_two_axes_sums_to_one():
    out = hn.softmax(logits(), ("pos", "vocab"))
    # p = e / sum(e) (the exps' errors cancel): the softmax's sum and division, then this sum, of 20
    # positive addends each
    terms = 2 * Pos.size * Vocab.size + 2
    np.testing.assert_allclose(
        out.sum(("pos", "vocab")).array, np.ones(3), atol=summation_tolerance(1.0, terms), rtol=0
    )


def test_masked_softmax_equals_softmax_of_the_kept_entries():
    x = logits()
    keep = hn.arange(Pos) < 2  # mask broadcast by name over batch and vocab
    out = hn.softmax(x, "pos", where=keep).unwrap("batch", "pos", "vocab")
    expected = jax.nn.softmax(x.array[:, :2, :], axis=1)
    # Relative, entry by entry: the two programs' exp (of the same shifted logit), their sum of 2 positive
    # terms and the division may round differently; nothing cancels.
    relative = summation_tolerance(1.0, FUNCTION_TERMS + 2 + 2)
    np.testing.assert_allclose(out[:, :2, :], expected, rtol=relative, atol=0)
    assert np.all(np.asarray(out[:, 2:, :]) == 0)
    log_out = hn.log_softmax(x, "pos", where=keep).unwrap("batch", "pos", "vocab")
    # log(p) against shifted - log(sum), absolute: p's relative error (as above) and the sum's (exp, 2 terms)
    # are absolute errors of the logarithms, each log adds its own on values up to |log p|, and the subtraction
    log_expected = jnp.log(expected)
    bound = summation_tolerance(1.0 + np.abs(log_expected).max(), 4 * FUNCTION_TERMS + 9)
    np.testing.assert_allclose(log_out[:, :2, :], log_expected, atol=bound, rtol=0)
    assert np.all(np.isneginf(np.asarray(log_out[:, 2:, :])))


def test_fully_masked_row_gives_zeros_not_nan():
    out = hn.softmax(logits(), "pos", where=hn.zeros(Pos, bool))
    assert np.all(np.asarray(out.array) == 0)


def test_gradients():
    x = logits()
    check_grads_jitted(lambda a: hn.softmax(hn.named(a, ("b", "p", "v")), "v").array, (x.array,), order=2)
    keep = hn.named(jnp.array([True, False, True, True]), ("p",))
    check_grads_jitted(lambda a: hn.softmax(hn.named(a, ("b", "p", "v")), "p", where=keep).array, (x.array,))
    check_grads_jitted(lambda a: hn.log_softmax(hn.named(a, ("b", "p", "v")), "v").array, (x.array,))


def test_unknown_axis_names_the_axes():
    with pytest.raises(KeyError, match=r"'embed'.*batch=3"):
        hn.softmax(logits(), "embed")


@settings(max_examples=15)
@given(data=st.data(), pool=axis_pools(), seed=seeds, masked=st.booleans())
def test_softmax_property_random_axes(data, pool, seed, masked):
    x = values(data.draw(st.permutations(pool)), seed)
    axis = data.draw(st.sampled_from(x.axis_names))
    k = x.axis_names.index(axis)
    raw = np.asarray(x.array, np.float64)
    where = None
    keep = np.ones_like(raw, bool)
    if masked:
        where = values(data.draw(subsets(x.axes)), seed + 1, "bool") | (hn.arange(x.axis(axis)) == 0)
        keep = np.broadcast_to(numpy_aligned(where, x.axes), raw.shape)
    exp = np.where(keep, np.exp(raw - raw.max(axis=k, keepdims=True)), 0)
    expected = exp / exp.sum(axis=k, keepdims=True)
    # float32 against float64. Relative, entry by entry: x - max rounds by up to |x - max| eps (an absolute
    # error of exp's argument, a relative one of its value), exp's own, the positive sum of n terms and the
    # division; masked entries are 0 exactly.
    n, spread = x.axis(axis).size, float(np.max(raw.max(axis=k, keepdims=True) - raw))
    relative = summation_tolerance(1.0 + spread, n + FUNCTION_TERMS + 2)
    np.testing.assert_allclose(hn.softmax(x, axis, where=where).array, expected, rtol=relative, atol=0)
    log_out = np.asarray(hn.log_softmax(x, axis, where=where).array)
    # absolute: (x - max) - log(sum): the sum's relative error, log's own and the subtraction's, at most
    # |log p| in size
    log_expected = np.log(expected[keep])
    bound = summation_tolerance(1.0 + spread + np.abs(log_expected).max(), n + 2 * FUNCTION_TERMS + 2)
    np.testing.assert_allclose(log_out[keep], log_expected, atol=bound, rtol=0)


@given(data=st.data(), pool=axis_pools(), seed=seeds)
def test_one_hot_property(data, pool, seed):
    axes = tuple(data.draw(st.permutations(pool)))
    rng = np.random.default_rng(seed)
    raw = rng.integers(-1, 5, [a.size for a in axes])
    Classes = Axis("classes", 5)  # not among the pool's names
    out = hn.one_hot(hn.named(jnp.asarray(raw), axes), Classes)
    assert out.axes == axes + (Classes,)
    np.testing.assert_array_equal(out.array, (raw[..., None] == np.arange(5)).astype(np.float32))
