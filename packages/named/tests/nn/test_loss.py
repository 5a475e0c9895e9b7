"""Cross-entropy and z-loss against numpy log-softmax references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import named
from halyard.named.nn import cross_entropy_loss, z_loss


def _log_softmax(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


# A token's loss: the log-sum-exp over 7 logits (an exp each, their sum, a log) minus the label's logit,
# which cancel down to the loss: the bound is at the logits' size.
TOKEN_TERMS = 7 + 2 * FUNCTION_TERMS + 1
TOKENS = 2 * 5


def _token_bound(logits) -> float:
    return summation_tolerance(np.abs(logits).max(), TOKEN_TERMS)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
    labels = rng.integers(0, 7, size=(2, 5)).astype(np.int32)
    return logits, labels


def test_integer_labels_mean_sum_none_match_numpy_in_any_axis_order():
    logits, labels = _data()
    per_token = -np.take_along_axis(_log_softmax(logits), labels[..., None], -1)[..., 0]
    named_logits = named(np.moveaxis(logits, -1, 0), ("vocab", "batch", "pos"))
    named_labels = named(labels.T, ("pos", "batch"))
    none = cross_entropy_loss(named_logits, named_labels, "vocab", reduction="none")
    assert none.axis_names == ("batch", "pos")
    np.testing.assert_allclose(np.asarray(none.array), per_token, atol=_token_bound(logits), rtol=0)
    mean = cross_entropy_loss(named_logits, named_labels, "vocab")
    bound = summation_tolerance(np.abs(logits).max(), TOKEN_TERMS + TOKENS)
    np.testing.assert_allclose(float(mean.array), per_token.mean(), atol=bound, rtol=0)
    total = cross_entropy_loss(named_logits, named_labels, "vocab", reduction="sum")
    np.testing.assert_allclose(float(total.array), per_token.sum(), atol=bound * TOKENS, rtol=0)


def test_where_mask_excludes_tokens_from_the_mean():
    logits, labels = _data(1)
    keep = np.array([[True, True, False, False, True], [False, True, True, True, True]])
    per_token = -np.take_along_axis(_log_softmax(logits), labels[..., None], -1)[..., 0]
    loss = cross_entropy_loss(
        named(logits, ("batch", "pos", "vocab")),
        named(labels, ("batch", "pos")),
        "vocab",
        where=named(keep, ("batch", "pos")),
    )
    bound = summation_tolerance(np.abs(logits).max(), TOKEN_TERMS + TOKENS)
    np.testing.assert_allclose(float(loss.array), per_token[keep].mean(), atol=bound, rtol=0)
    nothing = named(np.zeros((2, 5), bool), ("batch", "pos"))
    empty = cross_entropy_loss(
        named(logits, ("batch", "pos", "vocab")), named(labels, ("batch", "pos")), "vocab", where=nothing
    )
    assert float(empty.array) == 0.0


def test_soft_labels_equal_integer_labels_when_one_hot():
    logits, labels = _data(2)
    one_hot = np.eye(7, dtype=np.float32)[labels]
    named_logits = named(logits, ("batch", "pos", "vocab"))
    hard = cross_entropy_loss(named_logits, named(labels, ("batch", "pos")), "vocab")
    soft = cross_entropy_loss(named_logits, named(one_hot, ("batch", "pos", "vocab")), "vocab")
    # the soft labels' sum over the 7 log-probabilities (one of them 1) in place of a gather
    bound = summation_tolerance(np.abs(logits).max(), TOKEN_TERMS + 7 + TOKENS)
    np.testing.assert_allclose(float(hard.array), float(soft.array), atol=bound, rtol=0)


def test_gradient_is_softmax_minus_one_hot():
    logits, labels = _data(3)
    grad = jax.grad(
        lambda x: cross_entropy_loss(x, named(labels, ("batch", "pos")), "vocab", reduction="sum").array
    )(named(logits, ("batch", "pos", "vocab")))
    expected = np.exp(_log_softmax(logits)) - np.eye(7)[labels]
    # a probability (at most 1) moves by its log's error, and the exp's
    bound = _token_bound(logits) + summation_tolerance(1.0, FUNCTION_TERMS)
    np.testing.assert_allclose(np.asarray(grad.array), expected, atol=bound, rtol=0)


def test_bf16_logits_are_reduced_in_float32():
    logits, labels = _data(4)
    loss = cross_entropy_loss(
        named(jnp.asarray(logits, jnp.bfloat16), ("batch", "pos", "vocab")),
        named(labels, ("batch", "pos")),
        "vocab",
    )
    assert loss.dtype == jnp.float32


def test_z_loss_is_squared_logsumexp():
    logits, _ = _data(5)
    lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    loss = z_loss(named(logits, ("batch", "pos", "vocab")), "vocab")
    # the square doubles the log-sum-exp's error (at the logits' size) times the log-sum-exp
    per_token_bound = 2 * np.abs(lse).max() * _token_bound(logits) + summation_tolerance(lse**2, 1)
    mean_bound = per_token_bound + summation_tolerance(lse**2, TOKENS)
    np.testing.assert_allclose(float(loss.array), (lse**2).mean(), atol=mean_bound, rtol=0)
    per_token = z_loss(named(logits, ("batch", "pos", "vocab")), "vocab", reduction="none")
    np.testing.assert_allclose(np.asarray(per_token.array), lse**2, atol=per_token_bound, rtol=0)


def test_loss_errors():
    logits, labels = _data(6)
    named_logits = named(logits, ("batch", "pos", "vocab"))
    with pytest.raises(KeyError, match="vocab"):
        cross_entropy_loss(named_logits, named(labels, ("batch", "pos")), "tokens")
    with pytest.raises(ValueError, match="integer labels"):
        cross_entropy_loss(named_logits, named(labels[0], ("pos",)), "vocab")
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy_loss(named_logits, named(labels, ("batch", "pos")), "vocab", reduction="avg")
    with pytest.raises(TypeError, match="boolean"):
        cross_entropy_loss(
            named_logits,
            named(labels, ("batch", "pos")),
            "vocab",
            where=named(np.ones((2, 5)), ("batch", "pos")),
        )
