"""The batch convention: shifted labels, positions restarting per document, no cross-document loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import decoder_terms, summation_tolerance
from tiny import tiny

from halyard.models import LmBatch, init_model, segment_positions
from halyard.models.attention import AttentionMask
from halyard.named import named


def test_from_tokens_shifts_and_masks_document_boundaries() -> None:
    tokens = np.array([[10, 11, 12, 13, 14, 15, 16]], np.int32)
    segments = np.array([[0, 0, 0, 1, 1, 2, 2]], np.int32)
    loss_mask = np.array([[1, 1, 1, 1, 1, 1, 0]], np.int32)
    batch = LmBatch.from_tokens(tokens, segments, loss_mask)
    assert batch.tokens.unwrap("batch", "pos").tolist() == [[10, 11, 12, 13, 14, 15]]
    assert batch.labels.unwrap("batch", "pos").tolist() == [[11, 12, 13, 14, 15, 16]]
    assert batch.positions.unwrap("batch", "pos").tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch.segment_ids.unwrap("batch", "pos").tolist() == [[0, 0, 0, 1, 1, 2]]
    # 12->13 and 14->15 cross documents; 15->16 is masked by the loader's mask
    assert batch.loss_mask.unwrap("batch", "pos").tolist() == [[1, 1, 0, 1, 0, 0]]


def test_without_segments_positions_are_arange_and_everything_counts() -> None:
    batch = LmBatch.from_tokens(jnp.arange(10, dtype=jnp.int32).reshape(2, 5))
    assert batch.positions.unwrap("batch", "pos").tolist() == [[0, 1, 2, 3]] * 2
    assert batch.segment_ids is None and float(batch.loss_mask.array.sum()) == 8


def test_segment_positions_matches_a_python_loop() -> None:
    rng = np.random.default_rng(0)
    segments = np.cumsum(rng.random((3, 40)) < 0.2, axis=1)
    expected = np.zeros_like(segments)
    for row in range(3):
        for i in range(1, 40):
            expected[row, i] = expected[row, i - 1] + 1 if segments[row, i] == segments[row, i - 1] else 0
    np.testing.assert_array_equal(np.asarray(segment_positions(jnp.asarray(segments))), expected)


def test_a_packed_document_gets_the_logits_it_gets_alone() -> None:
    model = init_model(tiny("llama"), jax.random.key(0))
    first, second = [3, 7, 1, 9, 4], [8, 2, 6, 5, 3, 1]
    packed = LmBatch.from_tokens(np.array([first + second + [0]]), np.array([[0] * 5 + [1] * 6 + [1]]))
    mask = AttentionMask(causal=True, segment_ids=packed.segment_ids)
    forward = jax.jit(lambda m, t, k, p: m(t, mask=k, positions=p).unwrap("batch", "pos", "vocab"))
    logits = forward(model, packed.tokens, mask, packed.positions)
    alone = jax.jit(lambda m, t: m(t).unwrap("batch", "pos", "vocab"))(
        model, named(jnp.asarray([second]), ("batch", "pos"))
    )
    # the same sums over the document's keys; the packed row's masked keys may change their order
    atol = summation_tolerance(alone, decoder_terms(model.model_config, 11))
    np.testing.assert_allclose(np.asarray(logits[0, 5:11]), np.asarray(alone[0]), atol=atol, rtol=0)


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="at least 2 tokens"):
        LmBatch.from_tokens(np.zeros((2, 1), np.int32))
    with pytest.raises(ValueError, match="segment_ids shape"):
        LmBatch.from_tokens(np.zeros((2, 5), np.int32), np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match="seq_len \\+ 1"):
        LmBatch.from_tokens(np.zeros((5,), np.int32))
