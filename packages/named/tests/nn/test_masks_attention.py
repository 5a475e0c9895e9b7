"""Masks against numpy tril/band constructions; attention against a numpy softmax(QK^T)V."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, attention_terms, summation_tolerance

from halyard.named import Axis, NamedArray, named
from halyard.named.nn import (
    attention_weights,
    causal_mask,
    dot_product_attention,
    segment_mask,
    sliding_window_mask,
)

Pos, KeyPos = Axis("pos", 6), Axis("key_pos", 6)


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(Pos, KeyPos)
    assert mask.axis_names == ("pos", "key_pos") and mask.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(mask.array), np.tril(np.ones((6, 6), bool)))


def test_causal_mask_with_offsets_for_decoding():
    mask = causal_mask(Axis("pos", 2), Axis("key_pos", 5), q_start=3)
    np.testing.assert_array_equal(np.asarray(mask.array), np.tril(np.ones((2, 5), bool), k=3))


def test_sliding_window_composes_with_causal():
    mask = causal_mask(Pos, KeyPos) & sliding_window_mask(Pos, KeyPos, 3)
    expected = np.tril(np.ones((6, 6), bool)) & ~np.tril(np.ones((6, 6), bool), k=-3)
    np.testing.assert_array_equal(np.asarray(mask.array), expected)
    window_only = sliding_window_mask(Pos, KeyPos, 3)
    np.testing.assert_array_equal(np.asarray(window_only.array), ~np.tril(np.ones((6, 6), bool), k=-3))


def test_segment_mask_broadcasts_batch_and_composes():
    segments = np.array([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 6, 6]], np.int32)
    seg = named(segments, ("batch", "pos"))
    mask = causal_mask(Pos, KeyPos) & segment_mask(seg)
    expected = np.tril(np.ones((6, 6), bool))[None] & (segments[:, :, None] == segments[:, None, :])
    np.testing.assert_array_equal(np.asarray(mask.unwrap("batch", "pos", "key_pos")), expected)


def test_mask_errors():
    with pytest.raises(ValueError, match="key_pos"):
        causal_mask(Pos, Pos)
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(Pos, KeyPos, 0)
    seg = named(np.zeros((2, 6), np.int32), ("batch", "pos"))
    with pytest.raises(ValueError, match="rename"):
        segment_mask(seg, seg)


def _numpy_attention(q, k, v, mask, scale):
    scores = np.einsum("...qd,...kd->...qk", q, k) * scale
    scores = np.where(mask, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    return weights @ v


def _random(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_attention_matches_numpy_with_causal_mask():
    batch, heads, seq, head_size = 2, 3, 6, 4
    q, k, v = (_random((batch, heads, seq, head_size), s) for s in range(3))
    query = named(q, ("batch", "heads", "pos", "head_size")).rearrange("batch", "pos", "heads", "head_size")
    key = named(k, ("batch", "heads", "pos", "head_size"))  # renamed to key_pos automatically
    value = named(v, ("batch", "heads", "key_pos", "head_size"))
    out = dot_product_attention(query, key, value, causal_mask(Pos, KeyPos))
    assert out.axis_names == ("batch", "pos", "heads", "head_size")
    expected = _numpy_attention(q, k, v, np.tril(np.ones((seq, seq), bool)), 1 / np.sqrt(head_size))
    bound = summation_tolerance(expected, attention_terms(head_size, seq))  # numpy's float32 in its order
    np.testing.assert_allclose(
        np.asarray(out.unwrap("batch", "heads", "pos", "head_size")), expected, atol=bound, rtol=0
    )


def test_attention_gqa_by_axis_split_matches_repeated_heads():
    batch, kv_heads, group, seq, head_size = 2, 2, 3, 5, 4
    q = _random((batch, kv_heads, group, seq, head_size), 3)
    k = _random((batch, kv_heads, seq, head_size), 4)
    v = _random((batch, kv_heads, seq, head_size), 5)
    query = named(q, ("batch", "kv_heads", "q_heads_per_group", "pos", "head_size"))
    key = named(k, ("batch", "kv_heads", "key_pos", "head_size"))
    value = named(v, ("batch", "kv_heads", "key_pos", "head_size"))
    mask = causal_mask(Axis("pos", seq), Axis("key_pos", seq))
    out = dot_product_attention(query, key, value, mask, scale=0.3)
    expected = _numpy_attention(q, k[:, :, None], v[:, :, None], np.tril(np.ones((seq, seq), bool)), 0.3)
    bound = summation_tolerance(expected, attention_terms(head_size, seq))
    np.testing.assert_allclose(np.asarray(out.array), expected, atol=bound, rtol=0)


def test_attention_with_segment_mask_batch_axis_and_bias():
    seq = 6
    q, k, v = (_random((2, seq, 4), s) for s in range(6, 9))
    segments = np.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]], np.int32)
    mask = causal_mask(Pos, KeyPos) & segment_mask(named(segments, ("batch", "pos")))
    bias = named(_random((seq, seq), 9), ("pos", "key_pos"))
    out = dot_product_attention(
        named(q.transpose(1, 0, 2), ("pos", "batch", "head_size")),
        named(k, ("batch", "key_pos", "head_size")),
        named(v, ("batch", "key_pos", "head_size")),
        mask,
        bias=bias,
    )
    full_mask = np.tril(np.ones((seq, seq), bool))[None] & (segments[:, :, None] == segments[:, None, :])
    scores = np.einsum("bqd,bkd->bqk", q, k) / 2.0 + np.asarray(bias.array)
    scores = np.where(full_mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    assert out.axis_names == ("pos", "batch", "head_size")
    bound = summation_tolerance(weights @ v, attention_terms(4, seq) + 1)  # + the bias's sum
    np.testing.assert_allclose(
        np.asarray(out.unwrap("batch", "pos", "head_size")), weights @ v, atol=bound, rtol=0
    )


def test_fully_masked_rows_are_finite_with_finite_gradients():
    q = named(_random((3, 4), 10), ("pos", "head_size"))
    k = named(_random((3, 4), 11), ("key_pos", "head_size"))
    mask = NamedArray(
        jnp.array([[True, False, False], [False, False, False], [True, True, True]]),
        (Axis("pos", 3), Axis("key_pos", 3)),
    )
    weights = attention_weights(q, k, mask)
    # equal scores (all masked): exp(0) = 1 three times, 1 / 3 rounded once; one key kept: 1 and exp's 0s
    np.testing.assert_array_equal(np.asarray(weights.array[1]), np.float32(1 / 3))
    np.testing.assert_array_equal(np.asarray(weights.array[0]), [1.0, 0.0, 0.0])
    grad = jax.grad(lambda q: jnp.sum(dot_product_attention(q, k, k, mask).array))(q)
    assert np.isfinite(np.asarray(grad.array)).all()


def test_attention_gradient_matches_plain_jax():
    q, k, v = (_random((5, 4), s) for s in range(12, 15))
    mask = np.tril(np.ones((5, 5), bool))

    def named_loss(q, k, v):
        out = dot_product_attention(
            named(q, ("pos", "head_size")),
            named(k, ("key_pos", "head_size")),
            named(v, ("key_pos", "head_size")),
            causal_mask(Axis("pos", 5), Axis("key_pos", 5)),
        )
        return jnp.sum(jnp.sin(out.array))

    def plain_loss(q, k, v):
        scores = jnp.where(mask, q @ k.T / 2.0, -jnp.inf)
        return jnp.sum(jnp.sin(jax.nn.softmax(scores, -1) @ v))

    named_grads = jax.jit(jax.grad(named_loss, argnums=(0, 1, 2)))(q, k, v)
    plain_grads = jax.grad(plain_loss, argnums=(0, 1, 2))(q, k, v)
    # two programs: the forward's and backward's sums (the queries' over each key) and the sin
    terms = attention_terms(4, 5, queries_per_key=5) + 2 * FUNCTION_TERMS
    for a, b in zip(named_grads, plain_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=summation_tolerance(b, terms), rtol=0)


def test_attention_errors():
    q = named(jnp.ones((3, 4)), ("pos", "head_size"))
    with pytest.raises(ValueError, match="neither"):
        dot_product_attention(q, named(jnp.ones((3, 4)), ("time", "head_size")), q)
    with pytest.raises(TypeError, match="boolean"):
        dot_product_attention(q, q, q, named(jnp.ones((3, 3)), ("pos", "key_pos")))
    with pytest.raises(KeyError, match="head_size"):
        dot_product_attention(named(jnp.ones((3, 4)), ("pos", "dim")), q, q)


def test_attention_weights_layout_and_bias_with_extra_axis():
    q = named(_random((2, 3, 4), 20), ("pos", "heads", "head_size"))
    k = named(_random((3, 3, 4), 21), ("key_pos", "heads", "head_size"))
    bias = named(_random((2, 2, 3), 22), ("batch", "pos", "key_pos"))  # an axis the scores lack
    weights = attention_weights(q, k, bias=bias)
    assert weights.axis_names[-2:] == ("pos", "key_pos")
    scores = np.einsum("qhd,khd->hqk", np.asarray(q.array), np.asarray(k.array)) / 2.0
    scores = scores[None] + np.asarray(bias.array)[:, None]
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    # a weight's relative error: its score's and the sum's, whose errors are a score's dot product (4 terms)
    # at the scores' size, the exp and the sum over 3 keys
    relative = summation_tolerance(np.abs(scores).max(), 2 * (4 + 1 + FUNCTION_TERMS + 3))
    np.testing.assert_allclose(
        np.asarray(weights.unwrap("batch", "heads", "pos", "key_pos")), expected, rtol=relative
    )
