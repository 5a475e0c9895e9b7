"""Logits parity with `transformers` for every family (random tiny models, f32, right-padded batch); the
Halyard model and its config come through the family's Hugging Face spec (`hf_weights`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import torch
import transformers
from family_checks import referee_logits_tolerance
from hf_weights import halyard_from_torch

from halyard.models.attention import AttentionMask
from halyard.named import named

SEQ = 12
VOCAB = 97


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(2, SEQ)).astype(np.int64)
    attention_mask = np.ones((2, SEQ), np.int64)
    attention_mask[1, SEQ - 4 :] = 0  # right padding on the second row
    return ids, attention_mask


def _compare(hf_model: Any, model: Any) -> None:
    ids, attention_mask = _batch()
    with torch.no_grad():
        expected = hf_model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask)
        ).logits.numpy()
    tokens = named(jax.numpy.asarray(ids, jax.numpy.int32), ("batch", "pos"))
    mask = AttentionMask(
        causal=True, key_valid=named(jax.numpy.asarray(attention_mask, bool), ("batch", "key_pos"))
    )
    logits = jax.jit(lambda m, t, k: m(t, mask=k))(model, tokens, mask).unwrap("batch", "pos", "vocab")
    valid = attention_mask.astype(bool)
    assert np.abs(expected).max() > 0.05, "logits too small for a meaningful comparison"
    bound = referee_logits_tolerance(model, expected[valid], SEQ)
    np.testing.assert_allclose(np.asarray(logits)[valid], expected[valid], atol=bound, rtol=0)


def _hf(config: Any, cls: Any) -> Any:
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    return cls(config).eval().float()


def test_gpt2_matches_transformers() -> None:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, initializer_range=0.2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    hf_model = _hf(config, transformers.GPT2LMHeadModel)
    _compare(hf_model, halyard_from_torch(hf_model))


LLAMA_CASES = {
    "mha_untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "gqa_tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mqa": dict(num_attention_heads=4, num_key_value_heads=1),
    "head_dim_independent": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "rope_llama3": dict(
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8,
        )
    ),
    "rope_linear": dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "rope_yarn": dict(
        rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8
        )
    ),
    "attention_bias": dict(attention_bias=True, mlp_bias=True),
}


def _llama_like(cls: Any, model_cls: Any, **kwargs: Any) -> None:
    defaults = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
    )  # fmt: skip
    defaults.update(kwargs)
    config = cls(**defaults)
    hf_model = _hf(config, model_cls)
    _compare(hf_model, halyard_from_torch(hf_model))


@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_llama_matches_transformers(case: str) -> None:
    _llama_like(transformers.LlamaConfig, transformers.LlamaForCausalLM, **LLAMA_CASES[case])


def test_mistral_sliding_window_matches_transformers() -> None:
    # the window (4) is much shorter than the sequence (12), so the window really cuts keys off
    _llama_like(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=4)


def test_qwen2_qkv_bias_matches_transformers() -> None:
    _llama_like(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, tie_word_embeddings=True)
