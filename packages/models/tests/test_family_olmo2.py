"""OLMo 2: logits against transformers' Olmo2 (norms after attention and after the MLP, none before; q/k
norms over the whole projections; an explicit head size; biases on all four projections), KV-cache
decoding, and training steps scanned, unrolled, rematerialised and sharded."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import transformers
from family_checks import (
    assert_generation_matches_forward,
    assert_logits_match,
    assert_training_steps_agree,
    randomize_norms,
    training_batch,
)
from hf_weights import halyard_from_torch

from halyard.models import Olmo2Config
from halyard.models.rotary import RotaryConfig

VOCAB = 97
HF_BASE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6, eos_token_id=2, pad_token_id=0,
    rope_parameters=dict(rope_type="default", rope_theta=500000.0),
)  # fmt: skip
HALYARD_BASE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, max_position=64,
    initializer_range=0.2, rope=RotaryConfig(theta=500000.0),
)  # fmt: skip

# (transformers config changes, the same model in Halyard's fields)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mha_untied": (dict(num_key_value_heads=4), dict(num_kv_heads=4)),
    "gqa_tied_biases_head_dim": (
        dict(num_key_value_heads=2, tie_word_embeddings=True, attention_bias=True, head_dim=16),
        dict(num_kv_heads=2, tie_embeddings=True, attention_bias=True, head_dim=16),
    ),
}


@functools.cache
def _hf_model(case: str) -> Any:
    config = transformers.Olmo2Config(**HF_BASE, **CASES[case][0])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize_norms(transformers.Olmo2ForCausalLM(config).eval().float())


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str) -> None:
    hf_model = _hf_model(case)
    model = halyard_from_torch(hf_model)
    assert model.config == Olmo2Config(**HALYARD_BASE, **CASES[case][1])  # the reader's reading
    assert model.config.num_params() == sum(p.numel() for p in hf_model.parameters())
    layer = model.layers.stacked
    assert layer.attention_norm is None and layer.mlp_norm is None
    assert [axis.name for axis in layer.attention.k_norm.weight.axes] == ["layers", "kv_heads", "head_size"]
    assert_logits_match(model, hf_model, VOCAB)


def test_cached_generation_matches_the_full_forward() -> None:
    assert_generation_matches_forward(halyard_from_torch(_hf_model("gqa_tied_biases_head_dim")))


def test_training_steps_scanned_unrolled_and_sharded_agree() -> None:
    # tensor parallel splits the heads that the q/k norms reduce over
    assert_training_steps_agree(
        Olmo2Config(**HALYARD_BASE, num_kv_heads=2, head_dim=16), training_batch(VOCAB)
    )
