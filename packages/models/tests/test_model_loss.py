"""`CausalLM.loss` against a numpy cross-entropy over the full logits, with masks, sums and z-loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, decoder_terms, summation_tolerance
from tiny import VOCAB, tiny

from halyard.models import LmBatch, init_model
from halyard.models.attention import AttentionMask


def _numpy_loss(
    logits: np.ndarray, labels: np.ndarray, mask: np.ndarray, z_weight: float
) -> tuple[float, float]:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    per_token = (lse - picked) + z_weight * lse**2
    return float((per_token * mask).sum() / mask.sum()), float(mask.sum())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_loss_matches_numpy_on_a_packed_masked_batch(family: str) -> None:
    # a vocabulary block smaller than the vocabulary exercises the blocked cross-entropy
    model = init_model(tiny(family, loss_block_size=16, loss_full_logits_max_mib=0), jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(2, 10))
    segments = np.array([[0] * 4 + [1] * 6, [0] * 10])
    loss_mask = np.ones((2, 10))
    loss_mask[1, 7:] = 0
    batch = LmBatch.from_tokens(tokens, segments, loss_mask)
    loss, metrics = jax.jit(lambda m, b: m.loss(b, z_loss_weight=1e-3))(model, batch)
    logits = model(
        batch.tokens,
        mask=AttentionMask(causal=True, segment_ids=batch.segment_ids),
        positions=batch.positions,
    )
    expected, count = _numpy_loss(
        np.asarray(logits.unwrap("batch", "pos", "vocab")), np.asarray(batch.labels.unwrap("batch", "pos")),
        np.asarray(batch.loss_mask.unwrap("batch", "pos")), 1e-3,
    )  # fmt: skip
    # the loss's program against the logits' (the forward) and numpy: the vocabulary's log-sum-exp (blocked:
    # a rescaling per block), the tokens' mean, at the logits' size (the log-sum-exp and the label's cancel)
    terms = decoder_terms(model.model_config, 10) + 2 * VOCAB + 3 * FUNCTION_TERMS + count
    bound = summation_tolerance(np.abs(np.asarray(logits.array)).max(), terms)
    np.testing.assert_allclose(float(loss), expected, atol=bound, rtol=0)
    assert float(metrics["num_tokens"]) == count == (9 - 1) + (9 - 3)  # one boundary; three masked labels
    summed, _ = model.loss(batch, z_loss_weight=1e-3, reduction="sum")
    np.testing.assert_allclose(float(summed), expected * count, atol=bound * count, rtol=0)


def test_gradients_flow_to_every_parameter() -> None:
    import equinox as eqx

    model = init_model(tiny("llama", tie_embeddings=False), jax.random.key(1))
    batch = LmBatch.from_tokens(np.random.default_rng(1).integers(0, VOCAB, size=(2, 9)))
    grads = eqx.filter_grad(lambda m: m.loss(batch)[0])(model)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]
    assert len(norms) > 10 and all(n > 0 for n in norms)


def test_bf16_compute_is_close_to_float32() -> None:
    config = tiny("llama")
    model = init_model(config, jax.random.key(2))
    low = init_model(config.replace(compute_dtype="bfloat16"), jax.random.key(2))
    batch = LmBatch.from_tokens(np.random.default_rng(2).integers(0, VOCAB, size=(2, 9)))
    full_loss, _ = model.loss(batch)
    low_loss, _ = low.loss(batch)
    assert low.embed.weight.dtype == jnp.float32  # parameters stay float32; only compute is bf16
    np.testing.assert_allclose(float(low_loss), float(full_loss), rtol=2e-2)
