"""Tiny random `transformers` models of every supported family and variant, and logits comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from float_tolerance import referee_terms, summation_tolerance

from halyard.export.sources import SafetensorsSource
from halyard.models.attention import AttentionMask
from halyard.named import named

VOCAB = 97
SEQ = 12


def _llama_like(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    values.update(changes)
    return values


def _rope(rope_type: str, **values: Any) -> dict[str, Any]:
    return dict(rope_parameters=dict(rope_type=rope_type, rope_theta=10000.0, **values))


# name -> (config class, model class, config arguments)
CASES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(
            vocab_size=VOCAB,
            n_positions=32,
            n_embd=32,
            n_layer=2,
            n_head=4,
            initializer_range=0.2,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
    "llama_mha_untied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(num_key_value_heads=4, tie_word_embeddings=False),
    ),
    "llama_gqa_tied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(num_key_value_heads=2, tie_word_embeddings=True),
    ),
    "llama_mqa": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(num_key_value_heads=1),
    ),
    "llama_rope_llama3": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            )
        ),
    ),
    "llama_rope_linear": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(**_rope("linear", factor=2.0)),
    ),
    "llama_rope_yarn": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(**_rope("yarn", factor=4.0, original_max_position_embeddings=8)),
    ),
    # the sequence (12) is longer than max_position_embeddings (8), so dynamic NTK scaling is active
    "llama_rope_dynamic": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(max_position_embeddings=8, **_rope("dynamic", factor=2.0)),
    ),
    "llama_bias_head_dim": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        _llama_like(attention_bias=True, mlp_bias=True, head_dim=16),
    ),
    # the window (4) is much shorter than the sequence (12)
    "mistral_sliding_window": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        _llama_like(sliding_window=4),
    ),
    "qwen2_qkv_bias": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        _llama_like(tie_word_embeddings=True),
    ),
    "qwen2_sliding_window": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        _llama_like(use_sliding_window=True, sliding_window=4, max_window_layers=0),
    ),
    # layer 0 attends to everything, layers 1 and 2 only to the last 4 positions (transformers' rule)
    "qwen2_window_from_layer_1": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        _llama_like(use_sliding_window=True, sliding_window=4, max_window_layers=1, num_hidden_layers=3),
    ),
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        _llama_like(intermediate_size=40, num_local_experts=4, num_experts_per_tok=2),
    ),
}


def build(case: str, seed: int = 0) -> Any:
    """A random-init f32 `transformers` model of ``case`` (eager attention, eval mode)."""
    config_class, model_class, values = CASES[case]
    config = config_class(**values)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return model_class(config).eval().float()


def save(case: str, folder: Path, **save_kwargs: Any) -> Any:
    """Build ``case`` and ``save_pretrained`` it into ``folder``; returns the torch model."""
    model = build(case)
    model.save_pretrained(folder, **save_kwargs)
    return model


def padded_batch(seed: int = 0, vocab: int = VOCAB) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [2, SEQ], attention_mask [2, SEQ])``, the second row right-padded by 4 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(2, SEQ)).astype(np.int64)
    attention_mask = np.ones((2, SEQ), np.int64)
    attention_mask[1, SEQ - 4 :] = 0
    return ids, attention_mask


def torch_logits(model: Any, ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask))
    return out.logits.float().numpy()


@eqx.filter_jit
def _forward(model: Any, tokens: Any, mask: AttentionMask) -> jax.Array:
    return model(tokens, mask=mask).unwrap("batch", "pos", "vocab")


def halyard_logits(model: Any, ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The model's logits under jit (one compilation is faster than running a tiny model op by op)."""
    tokens = named(jnp.asarray(ids, jnp.int32), ("batch", "pos"))
    mask = AttentionMask(
        causal=True, key_valid=named(jnp.asarray(attention_mask, bool), ("batch", "key_pos"))
    )
    return np.asarray(jax.device_get(_forward(model, tokens, mask)))


def referee_tolerance(config: Any, logits: np.ndarray) -> float:
    """How far Halyard's float32 logits of ``config``'s model and transformers' (``logits``: either, ``[batch,
    pos, vocab]``) may differ: `summation_tolerance` of `referee_terms` over the positions, at the logits'
    size. (1e-4 was a number one CPU meets: these logits, up to ~4, are bounded at ~7e-4, mostly the rotary
    angles' own rounding in each implementation; the differences measured are ~5e-6.)"""
    return summation_tolerance(logits, referee_terms(config, logits.shape[1]))


def assert_logits_close(
    expected: np.ndarray, actual: np.ndarray, attention_mask: np.ndarray, atol: float
) -> None:
    """Compare at the non-padding positions; the logits must be large enough to mean something. ``atol``:
    `referee_tolerance` for two implementations, 0 for one transformers model on the same tensors."""
    valid = attention_mask.astype(bool)
    assert np.abs(expected[valid]).max() > 0.05, "logits too small for a meaningful comparison"
    difference = np.abs(expected[valid] - actual[valid][..., : expected.shape[-1]]).max()
    assert difference <= atol, f"max abs logits difference {difference} > {atol}"


def count_reads(monkeypatch: Any) -> dict[str, int]:
    """Elements read from each checkpoint tensor from now on (``monkeypatch``: pytest's fixture), by key."""
    reads: dict[str, int] = {}
    original_read = SafetensorsSource.read

    def counting_read(self: SafetensorsSource, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        block = original_read(self, key, slices)
        reads[key] = reads.get(key, 0) + block.size
        return block

    monkeypatch.setattr(SafetensorsSource, "read", counting_read)
    return reads
