"""`AttentionMask` semantics (vs transformers' mask functions and numpy) and the dispatch rules."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

from halyard.models.attention import AUTO_XLA_MAX_SCORES, AttentionMask, attention
from halyard.models.attention.dispatch import choose_implementation, default_block_size
from halyard.models.attention.layout import flatten_inputs
from halyard.named import Axis, named

Pos, KeyPos = Axis("pos", 9), Axis("key_pos", 9)


@pytest.mark.parametrize("window", [1, 2, 4, 20])
def test_sliding_window_matches_transformers_mistral_semantics(window: int) -> None:
    rule = and_masks(causal_mask_function, sliding_window_overlay(window))
    expected = np.array(
        [
            [bool(rule(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(KeyPos.size)]
            for q in range(Pos.size)
        ]
    )
    actual = AttentionMask(causal=True, sliding_window=window).materialize(Pos, KeyPos)
    assert actual.axis_names == ("pos", "key_pos")
    np.testing.assert_array_equal(actual.array, expected)
    # The window counts the query itself: each row sees min(window, q + 1) keys.
    np.testing.assert_array_equal(expected.sum(1), np.minimum(window, np.arange(Pos.size) + 1))


def test_materialize_combines_every_rule_like_numpy_loops() -> None:
    segments = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2], [5] * 9])
    valid = np.array([[True] * 9, [False, False] + [True] * 7])
    query_positions = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15, 16, 17, 18]])
    key_positions = query_positions.copy()
    mask = AttentionMask(
        causal=True,
        sliding_window=3,
        segment_ids=named(jnp.asarray(segments), ("batch", "pos")),
        query_positions=named(jnp.asarray(query_positions), ("batch", "pos")),
        key_positions=named(jnp.asarray(key_positions), ("batch", "key_pos")),
        key_valid=named(jnp.asarray(valid), ("batch", "key_pos")),
    )
    actual = mask.materialize(Pos, KeyPos)
    assert actual.axis_names == ("batch", "pos", "key_pos")
    expected = np.zeros((2, 9, 9), bool)
    for b, i, j in itertools.product(range(2), range(9), range(9)):
        qp, kp = query_positions[b, i], key_positions[b, j]
        expected[b, i, j] = kp <= qp and kp > qp - 3 and segments[b, i] == segments[b, j] and valid[b, j]
    np.testing.assert_array_equal(actual.array, expected)


def test_mask_is_a_pytree_with_static_flags() -> None:
    segments = named(jnp.asarray([[0, 0, 1]]), ("batch", "pos"))
    mask = AttentionMask(causal=True, sliding_window=2, segment_ids=segments)
    leaves, treedef = jax.tree_util.tree_flatten(mask)
    assert len(leaves) == 1
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.sliding_window == 2 and rebuilt.causal
    compiled = jax.jit(lambda m: m.materialize(Axis("pos", 3), Axis("key_pos", 3)).array)(mask)
    np.testing.assert_array_equal(compiled[0], [[1, 0, 0], [1, 1, 0], [0, 0, 1]])


@pytest.mark.parametrize("window", [0, -1, 2.5, True])
def test_bad_window_is_refused(window: object) -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        AttentionMask(sliding_window=window)  # type: ignore[arg-type]


def test_plain_array_mask_fields_are_refused() -> None:
    with pytest.raises(TypeError, match="segment_ids must be a NamedArray"):
        AttentionMask(segment_ids=jnp.zeros((1, 3)))  # type: ignore[arg-type]


def test_segment_ids_with_different_key_length_need_key_segment_ids() -> None:
    segments = named(jnp.zeros((1, 4), jnp.int32), ("batch", "pos"))
    with pytest.raises(ValueError, match="pass key_segment_ids"):
        AttentionMask(segment_ids=segments).materialize(Axis("pos", 4), Axis("key_pos", 6))


def test_mask_array_with_wrong_axis_names_the_axis() -> None:
    valid = named(jnp.ones((1, 4), bool), ("batch", "pos"))
    with pytest.raises(ValueError, match="key_valid.*'key_pos'"):
        AttentionMask(key_valid=valid).materialize(Axis("pos", 4), Axis("key_pos", 4))


def _qkv(num_queries: int, num_keys: int, heads: int = 2, kv_heads: int = 1, dtype=jnp.float32) -> tuple:
    return (
        named(jnp.zeros((1, num_queries, heads, 8), dtype), ("batch", "pos", "heads", "head_size")),
        named(jnp.zeros((1, num_keys, kv_heads, 8), dtype), ("batch", "key_pos", "kv_heads", "head_size")),
        named(jnp.zeros((1, num_keys, kv_heads, 8), dtype), ("batch", "key_pos", "kv_heads", "head_size")),
    )


def test_auto_rule() -> None:
    short = flatten_inputs(*_qkv(64, 64), AttentionMask())
    long_length = int(np.sqrt(AUTO_XLA_MAX_SCORES)) + 1
    long = flatten_inputs(*_qkv(long_length, long_length), AttentionMask())
    assert jax.default_backend() == "cpu"
    assert choose_implementation(short) == choose_implementation(long) == "blocked"
    # A TPU takes the Pallas splash kernel for self-attention at any length.
    assert (
        choose_implementation(short, backend="tpu") == choose_implementation(long, backend="tpu") == "splash"
    )
    # An accelerator without cuDNN (here: no NVIDIA GPU is present) uses xla for short sequences only.
    assert choose_implementation(short, backend="gpu") == "xla"


def test_default_block_size_is_64_on_cpu_and_128_elsewhere() -> None:
    assert default_block_size() == default_block_size("cpu") == 64
    assert default_block_size("gpu") == default_block_size("tpu") == 128


def test_no_block_size_uses_the_backend_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``block_size=None`` reaches the blocked kernel as the default block (seen through the kernel's call)."""
    import halyard.models.attention.dispatch as dispatch

    seen = []
    real = dispatch.blocked_attention
    monkeypatch.setattr(
        dispatch,
        "blocked_attention",
        lambda flat, **kwargs: seen.append(kwargs["block_size"]) or real(flat, **kwargs),
    )
    q, k, v = _qkv(8, 8)
    # traced only (the dispatch passes the block while tracing): nothing is compiled or run
    jax.eval_shape(lambda: attention(q, k, v, AttentionMask(causal=True), implementation="blocked"))
    jax.eval_shape(
        lambda: attention(q, k, v, AttentionMask(causal=True), implementation="blocked", block_size=4)
    )
    assert seen == [64, 4]


def test_cudnn_on_cpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cudnn.*NVIDIA GPU.*'auto', 'xla' or 'blocked'"):
        attention(*_qkv(4, 4, dtype=jnp.bfloat16), AttentionMask(), implementation="cudnn")


def test_unknown_implementation_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown implementation 'flash'.*blocked"):
        attention(*_qkv(4, 4), AttentionMask(), implementation="flash")


def test_heads_must_be_a_multiple_of_kv_heads() -> None:
    with pytest.raises(ValueError, match=r"heads \(3\) must be a multiple of kv_heads \(2\)"):
        attention(*_qkv(4, 4, heads=3, kv_heads=2), AttentionMask())


def test_missing_axis_is_named() -> None:
    query, key, value = _qkv(4, 4)
    with pytest.raises(ValueError, match="key has axes .* lacks \\['key_pos'\\]"):
        attention(query, key.rename({"key_pos": "pos"}), value, AttentionMask())


def test_mismatched_batch_axes_are_refused() -> None:
    query, key, value = _qkv(4, 4)
    with pytest.raises(ValueError, match="batch axes"):
        attention(query, key.rename({"batch": "beam"}), value.rename({"batch": "beam"}), AttentionMask())
