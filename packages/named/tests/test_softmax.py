"""softmax / log_softmax against jax.nn on the raw arrays, with and without masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

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
        np.testing.assert_allclose(out.array, reference(x.array, axis=position), rtol=1e-5, atol=1e-6)


def test_softmax_over_two_axes_sums_to_one():
    out = hn.softmax(logits(), ("pos", "vocab"))
    np.testing.assert_allclose(out.sum(("pos", "vocab")).array, np.ones(3), rtol=1e-5)


def test_masked_softmax_equals_softmax_of_the_kept_entries():
    x = logits()
    keep = hn.arange(Pos) < 2  # mask broadcast by name over batch and vocab
    out = hn.softmax(x, "pos", where=keep).unwrap("batch", "pos", "vocab")
    expected = jax.nn.softmax(x.array[:, :2, :], axis=1)
    np.testing.assert_allclose(out[:, :2, :], expected, rtol=1e-5)
    assert np.all(np.asarray(out[:, 2:, :]) == 0)
    log_out = hn.log_softmax(x, "pos", where=keep).unwrap("batch", "pos", "vocab")
    np.testing.assert_allclose(log_out[:, :2, :], jnp.log(expected), rtol=1e-5, atol=1e-6)
    assert np.all(np.isneginf(np.asarray(log_out[:, 2:, :])))


def test_fully_masked_row_gives_zeros_not_nan():
    out = hn.softmax(logits(), "pos", where=hn.zeros(Pos, bool))
    assert np.all(np.asarray(out.array) == 0)


def test_gradients():
    x = logits()
    check_grads(lambda a: hn.softmax(hn.named(a, ("b", "p", "v")), "v").array, (x.array,), order=2, eps=1e-2)
    keep = hn.named(jnp.array([True, False, True, True]), ("p",))
    check_grads(
        lambda a: hn.softmax(hn.named(a, ("b", "p", "v")), "p", where=keep).array,
        (x.array,),
        order=1,
        eps=1e-2,
    )


def test_unknown_axis_names_the_axes():
    with pytest.raises(KeyError, match=r"'embed'.*batch=3"):
        hn.softmax(logits(), "embed")
