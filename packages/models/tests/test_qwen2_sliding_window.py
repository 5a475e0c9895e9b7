"""Qwen2 with ``use_sliding_window``: full attention in the first ``max_window_layers`` layers, a window after.

Compared with transformers' Qwen2 (eager attention: it applies each layer's own mask), in both the scanned
and the unrolled layer stack, and with KV-cache decoding against the full forward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from family_checks import referee_logits_tolerance
from float_tolerance import decoder_terms, summation_tolerance
from hf_weights import halyard_from_torch
from paged import paged_logits

from halyard.models import Qwen2Config, init_model
from halyard.models.attention import AttentionMask
from halyard.named import named

VOCAB, SEQ, LAYERS, WINDOW, FULL_LAYERS = 97, 12, 4, 3, 2


def _hf_qwen2(max_window_layers: int = FULL_LAYERS) -> Any:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2,
        rms_norm_eps=1e-5, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=max_window_layers,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval().float()


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(2, SEQ)).astype(np.int64)
    attention_mask = np.ones((2, SEQ), np.int64)
    attention_mask[1, SEQ - 4 :] = 0
    return ids, attention_mask


def _torch_logits(hf_model: Any) -> np.ndarray:
    ids, attention_mask = _batch()
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask))
    return out.logits.numpy()


def _halyard_logits(model: Any) -> np.ndarray:
    ids, attention_mask = _batch()
    tokens = named(jnp.asarray(ids, jnp.int32), ("batch", "pos"))
    mask = AttentionMask(
        causal=True, key_valid=named(jnp.asarray(attention_mask, bool), ("batch", "key_pos"))
    )
    return np.asarray(
        jax.jit(lambda m, t, k: m(t, mask=k))(model, tokens, mask).unwrap("batch", "pos", "vocab")
    )


def _halyard_model(hf_model: Any, **overrides: Any) -> Any:
    return halyard_from_torch(hf_model, **overrides)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_windows_on_the_later_layers_match_transformers(scan_layers: bool) -> None:
    hf_model = _hf_qwen2()
    model = _halyard_model(hf_model, scan_layers=scan_layers)
    assert hf_model.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert model.config.layer_windows == (None, None, WINDOW, WINDOW)
    expected, actual = _torch_logits(hf_model), _halyard_logits(model)
    valid = _batch()[1].astype(bool)
    assert np.abs(expected).max() > 0.05
    bound = referee_logits_tolerance(model, expected[valid], SEQ)
    np.testing.assert_allclose(actual[valid], expected[valid], atol=bound, rtol=0)

    # the split matters at this length: a window on every layer, or on none, gives other logits
    for sliding_window in (WINDOW, None):
        other = _halyard_model(hf_model, full_attention_layers=0, sliding_window=sliding_window)
        assert np.abs(_halyard_logits(other)[valid] - expected[valid]).max() > 1e-2


def test_every_layer_full_is_the_model_without_a_window() -> None:
    hf_model = _hf_qwen2(max_window_layers=LAYERS)
    model = _halyard_model(hf_model, sliding_window=WINDOW, full_attention_layers=LAYERS)
    plain = _halyard_model(hf_model)  # transformers' layer_types: every layer full_attention
    assert plain.config.layer_windows == (None,) * LAYERS
    valid = _batch()[1].astype(bool)
    expected = _torch_logits(hf_model)[valid]
    bound = referee_logits_tolerance(model, expected, SEQ)
    np.testing.assert_allclose(_halyard_logits(model)[valid], expected, atol=bound, rtol=0)
    np.testing.assert_array_equal(_halyard_logits(model), _halyard_logits(plain))


def test_paged_decoding_matches_the_full_forward() -> None:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=LAYERS, num_heads=4, num_kv_heads=2,
        max_position=64, sliding_window=WINDOW, full_attention_layers=FULL_LAYERS, initializer_range=0.2,
    )  # fmt: skip
    model = init_model(config, jax.random.key(1))
    batch, length, prefill = 2, 9, 4
    tokens = named(jax.random.randint(jax.random.key(2), (batch, length), 0, VOCAB), ("batch", "pos"))
    full = np.asarray(jax.jit(lambda m, t: m(t))(model, tokens).unwrap("batch", "pos", "vocab"))

    paged = paged_logits(model, tokens, [prefill, *range(prefill + 1, length + 1)])
    # the same sums as the full forward, added in other orders (chunks, pages)
    terms = decoder_terms(model.model_config, length)
    np.testing.assert_allclose(paged, full, atol=summation_tolerance(full, terms), rtol=0)


def test_flops_count_full_attention_layers_at_full_length() -> None:
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=LAYERS, num_heads=4)
    windowed = Qwen2Config(**base, sliding_window=WINDOW).flops_per_token(SEQ)
    full = Qwen2Config(**base).flops_per_token(SEQ)
    mixed = Qwen2Config(**base, sliding_window=WINDOW, full_attention_layers=FULL_LAYERS).flops_per_token(SEQ)
    assert windowed < mixed < full
    np.testing.assert_allclose(mixed, windowed + (full - windowed) * FULL_LAYERS / LAYERS, rtol=1e-12)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(full_attention_layers=5, sliding_window=WINDOW), "between 0 and num_layers=4"),
        (dict(full_attention_layers=1), "only applies with a sliding_window"),
    ],
)
def test_bad_full_attention_layers_are_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_layers=LAYERS, num_heads=4, **changes)
