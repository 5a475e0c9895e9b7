"""Smoke use of halyard-models installed alone: a Llama forward whose loss matches its logits."""

import jax
import numpy as np

from halyard.models import LmBatch, init_model, model_config

sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2)
model = init_model(model_config("llama", num_layers=2, **sizes), jax.random.key(0))
windows = np.random.default_rng(0).integers(0, 64, size=(2, 9))  # [batch, seq_len + 1]
batch = LmBatch.from_tokens(windows)
loss, _ = jax.jit(lambda m, b: m.loss(b))(model, batch)
logits = np.asarray(
    jax.jit(lambda m, t: m(t))(model, batch.tokens).array, dtype=np.float64
)  # (batch, pos, vocab)
assert logits.shape == (2, 8, 64), logits.shape
shifted = logits - logits.max(-1, keepdims=True)
log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
expected = -np.take_along_axis(log_probs, windows[:, 1:, None], -1).mean()
np.testing.assert_allclose(float(loss), expected, rtol=1e-4)
print("models ok", logits.shape, float(loss))
