"""Qwen3: logits against transformers' Qwen3 (per-head q/k norms, its own head size, biases on all four
projections, full-then-windowed layers), KV-cache decoding, scan/remat and sharded training steps."""

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

from halyard.models import Qwen3Config
from halyard.models.rotary import RotaryConfig

VOCAB = 97
SHAPES = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=16
)
HF_SHAPES = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
)  # fmt: skip

# (transformers config changes, the same model in Halyard's fields)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "untied": (dict(num_hidden_layers=2), dict(num_layers=2)),
    "tied_with_biases": (
        dict(num_hidden_layers=2, tie_word_embeddings=True, attention_bias=True),
        dict(num_layers=2, tie_embeddings=True, attention_bias=True),
    ),
    # windows (3 < the 12-token batch) on the layers from max_window_layers on
    "full_then_windowed": (
        dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=3, max_window_layers=1),
        dict(num_layers=3, sliding_window=3, full_attention_layers=1),
    ),
}


@functools.cache
def _hf_model(case: str) -> Any:
    config = transformers.Qwen3Config(**HF_SHAPES, **CASES[case][0])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize_norms(transformers.Qwen3ForCausalLM(config).eval().float())


def _halyard(case: str, **overrides: Any) -> Any:
    return halyard_from_torch(_hf_model(case), **overrides)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str) -> None:
    hf_model = _hf_model(case)
    model = _halyard(case)
    fields = dict(SHAPES, **CASES[case][1], max_position=64, rope=RotaryConfig(theta=1000000.0))
    assert model.config == Qwen3Config(**fields, initializer_range=0.2)  # the reader's reading
    assert model.config.num_params() == sum(p.numel() for p in hf_model.parameters())
    assert model.layers.stacked.attention.q_norm.weight.axes[-1].name == "head_size"
    assert_logits_match(model, hf_model, VOCAB)


def test_windowed_layers_matter() -> None:
    # all layers full: other logits than transformers' full-then-windowed model
    model = _halyard("full_then_windowed", sliding_window=None, full_attention_layers=0)
    with pytest.raises(AssertionError):
        assert_logits_match(model, _hf_model("full_then_windowed"), VOCAB)


def test_cached_generation_matches_the_full_forward() -> None:
    # both kinds of layer; the 12-token sequences outgrow the window
    assert_generation_matches_forward(_halyard("full_then_windowed"))


def test_training_steps_scanned_unrolled_and_sharded_agree() -> None:
    assert_training_steps_agree(
        Qwen3Config(**SHAPES, num_layers=2, max_position=64, initializer_range=0.2), training_batch(VOCAB)
    )
