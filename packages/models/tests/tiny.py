"""Tiny configs shared by the tests (a few thousand parameters, compile in seconds)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from halyard.models import model_config
from halyard.named import NamedArray, named

VOCAB = 61


def tiny(family: str, **overrides: Any) -> Any:
    """A small config of ``family`` with wider-than-default init so that logits are not all near zero."""
    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, initializer_range=0.2
    )
    if family in ("llama", "mistral", "qwen2", "mixtral"):
        common.update(intermediate_size=48, num_kv_heads=2, max_position=128)
    if family == "mistral":
        common.update(sliding_window=4)
    if family == "mup":
        common = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, head_dim=8, d_base=16, max_position=128)
    if family == "gpt2":
        common.update(max_position=64)
    common.update(overrides)
    return model_config(family, **common)


def random_tokens(batch: int, length: int, seed: int = 0, vocab: int = VOCAB) -> NamedArray:
    """Uniform random token ids ``(batch, pos)``."""
    rng = np.random.default_rng(seed)
    return named(
        jax.numpy.asarray(rng.integers(0, vocab, size=(batch, length)), jax.numpy.int32), ("batch", "pos")
    )
