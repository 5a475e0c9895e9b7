"""Phi-3: logits against transformers' Phi3ForCausalLM (fused qkv_proj / gate_up_proj read through the spec;
longrope with partial rotary on batches shorter and longer than original_max_position_embeddings; a window
on every layer with tied embeddings; an explicit head_dim), KV-cache decoding, scan/remat and sharded
training steps, and the reader's Phi-3 rules (legacy rope types, the top-level pre-training length)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
import pytest
import torch
import transformers
from family_checks import (
    assert_generation_matches_forward,
    assert_same_loss_and_grads,
    halyard_logits,
    loss_and_grads,
    padded_batch,
    randomize_norms,
    referee_logits_tolerance,
    sharded_loss_and_grads,
    single_device_loss_and_grads,
    training_batch,
)
from hf_weights import halyard_config, halyard_from_torch

from halyard.models import Phi3Config, init_model
from halyard.models.hf import UnsupportedModelError, hf_family
from halyard.models.rotary import RotaryConfig

VOCAB = 97
ORIGINAL = 8  # the pre-training length of the longrope case: the 12-token batch is past it, 6 tokens are not
SHORT_FACTOR = (1.0, 1.3, 1.9, 2.6)  # one per rotating channel pair (16 channels x 0.5 / 2)
LONG_FACTOR = (2.0, 3.5, 5.0, 9.0)
HF_SHAPES: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=64, initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
LONGROPE = dict(type="longrope", short_factor=list(SHORT_FACTOR), long_factor=list(LONG_FACTOR))

# name -> transformers config arguments besides HF_SHAPES
CASES: dict[str, dict[str, Any]] = {
    "longrope_partial_gqa": dict(
        num_key_value_heads=2,
        partial_rotary_factor=0.5,
        rope_scaling=LONGROPE,
        original_max_position_embeddings=ORIGINAL,
    ),
    "window_tied_mha": dict(num_key_value_heads=4, sliding_window=3, tie_word_embeddings=True),
    "head_dim_gqa": dict(hidden_size=32, num_key_value_heads=2, head_dim=16, rope_theta=500.0),
}


@functools.cache
def _hf_model(case: str) -> Any:
    config = transformers.Phi3Config(**{**HF_SHAPES, **CASES[case]})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize_norms(transformers.Phi3ForCausalLM(config).eval().float())


def _halyard(case: str, **overrides: Any) -> Any:
    return halyard_from_torch(_hf_model(case), **overrides)


def _assert_logits_match(model: Any, hf_model: Any, length: int = 12) -> None:
    """Equal logits at the real positions of a full, a right-padded and a left-padded row of ``length``."""
    ids, attention_mask = padded_batch(VOCAB, length)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention_mask)).logits
    valid = attention_mask.astype(bool)
    assert np.abs(expected.numpy()[valid]).max() > 0.05, "logits too small for a meaningful comparison"
    got = halyard_logits(model, ids, attention_mask)[valid]
    bound = referee_logits_tolerance(model, expected.numpy()[valid], length)
    np.testing.assert_allclose(got, expected.numpy()[valid], atol=bound, rtol=0)


def test_configs_read_from_transformers() -> None:
    longrope = halyard_config(_hf_model("longrope_partial_gqa").config)
    assert isinstance(longrope, Phi3Config)
    assert longrope.rope == RotaryConfig(
        scaling="longrope", short_factor=SHORT_FACTOR, long_factor=LONG_FACTOR, original_max_position=ORIGINAL,
        partial_rotary_factor=0.5,
    )  # fmt: skip
    assert (longrope.num_kv_heads, longrope.sliding_window, longrope.tie_embeddings) == (2, None, False)
    windowed = halyard_config(_hf_model("window_tied_mha").config)
    assert (windowed.sliding_window, windowed.tie_embeddings, windowed.rope.scaling) == (3, True, "default")
    assert halyard_config(_hf_model("head_dim_gqa").config).head_size == 16


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str) -> None:
    hf_model = _hf_model(case)
    model = _halyard(case)
    assert model.model_config.num_params() == sum(p.numel() for p in hf_model.parameters())
    _assert_logits_match(model, hf_model)


def test_longrope_logits_match_before_the_original_length() -> None:
    # 6 tokens <= original_max_position_embeddings: transformers and Halyard rotate by the short factors
    _assert_logits_match(_halyard("longrope_partial_gqa"), _hf_model("longrope_partial_gqa"), length=6)


def _rope_with(case: str, **changes: Any) -> dict[str, Any]:
    return dict(rope=dataclasses.replace(halyard_config(_hf_model(case).config).rope, **changes))


# (case, Halyard config changes, batch length): each gives other logits than transformers' model.
OPTIONS_THAT_MATTER = [
    ("longrope_partial_gqa", _rope_with("longrope_partial_gqa", long_factor=SHORT_FACTOR), 12),
    ("longrope_partial_gqa", _rope_with("longrope_partial_gqa", short_factor=LONG_FACTOR), 6),
    ("longrope_partial_gqa", _rope_with("longrope_partial_gqa", original_max_position=16), 12),
    ("longrope_partial_gqa", _rope_with("longrope_partial_gqa", attention_factor=1.0), 12),
    ("window_tied_mha", dict(sliding_window=None), 12),
]


@pytest.mark.parametrize(
    ("case", "change", "length"),
    OPTIONS_THAT_MATTER,
    ids=[f"{c}-{n}" for n, (c, _, _) in enumerate(OPTIONS_THAT_MATTER)],
)
def test_each_option_changes_the_logits(case: str, change: dict[str, Any], length: int) -> None:
    with pytest.raises(AssertionError):
        _assert_logits_match(_halyard(case, **change), _hf_model(case), length)


@pytest.mark.parametrize("case", ["window_tied_mha", "head_dim_gqa"])
def test_cached_generation_matches_the_full_forward(case: str) -> None:
    assert_generation_matches_forward(_halyard(case))


def test_cached_longrope_generation_matches_the_full_forward() -> None:
    # Every sequence stays within the pre-training length. Past it transformers' generate recomputes the
    # cache with the long factors (Phi3ForCausalLM.prepare_inputs_for_generation); Halyard's does not yet.
    assert_generation_matches_forward(
        _halyard("longrope_partial_gqa", **_rope_with("longrope_partial_gqa", original_max_position=32))
    )


def _read(hf: dict[str, Any]) -> Phi3Config:
    config = hf_family("phi3").config(hf)
    assert isinstance(config, Phi3Config)
    return config


def test_legacy_rope_types_read_as_longrope() -> None:
    shapes = dict(
        HF_SHAPES, num_key_value_heads=2, partial_rotary_factor=0.5, original_max_position_embeddings=ORIGINAL
    )
    for legacy in ("su", "yarn"):
        assert (
            _read({**shapes, "rope_scaling": dict(LONGROPE, type=legacy)}).rope
            == halyard_config(_hf_model("longrope_partial_gqa").config).rope
        )
    # without the top-level key, Phi3Config's default pre-training length (4096) wins over the dict's
    hf = dict(
        HF_SHAPES, partial_rotary_factor=0.5, rope_scaling=dict(LONGROPE, original_max_position_embeddings=16)
    )
    assert _read(hf).rope.original_max_position == 4096
    with pytest.raises(UnsupportedModelError, match="rope type 'linear'"):
        _read(dict(HF_SHAPES, rope_scaling=dict(type="linear", factor=2.0)))


# 32-channel heads, half of them rotating: 8 channel pairs
WIDE_HEAD_LONGROPE = RotaryConfig(
    scaling="longrope", short_factor=(1.0,) * 8, long_factor=(2.0,) * 8, partial_rotary_factor=0.5
)


def test_the_writer_round_trips_and_refuses_what_phi3_cannot_hold() -> None:
    spec = hf_family("phi3")
    for case in CASES:
        config = halyard_config(_hf_model(case).config)
        assert spec.config(spec.write(config)) == config
    written = spec.write(halyard_config(_hf_model("longrope_partial_gqa").config))
    assert written["original_max_position_embeddings"] == ORIGINAL and written["partial_rotary_factor"] == 0.5
    tiny = Phi3Config(**SHAPES, num_layers=2)
    refusals: list[tuple[dict[str, Any], str]] = [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(full_attention_layers=1), "full_attention_layers=1"),
        (dict(rope=RotaryConfig(scaling="linear", factor=2.0)), "rope.scaling='linear'"),
        (
            dict(head_dim=32, rope=WIDE_HEAD_LONGROPE),
            "head_dim=32 .not hidden_size / num_heads. with longrope",
        ),
    ]
    for change, message in refusals:
        with pytest.raises(UnsupportedModelError, match=message):
            spec.write(tiny.replace(**change))


SHAPES: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_heads=4, num_kv_heads=2, max_position=64
)
BATCH = training_batch(VOCAB)
TRAIN_CONFIG = Phi3Config(
    **SHAPES, num_layers=2, initializer_range=0.2, sliding_window=4,
    rope=RotaryConfig(
        scaling="longrope", short_factor=SHORT_FACTOR, long_factor=LONG_FACTOR, original_max_position=ORIGINAL,
        partial_rotary_factor=0.5,
    ),
)  # fmt: skip


@functools.cache
def _reference() -> tuple[float, list[np.ndarray]]:
    return single_device_loss_and_grads(TRAIN_CONFIG.replace(remat="none"), BATCH)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_training_step_with_scan_and_remat(scan_layers: bool) -> None:
    config = TRAIN_CONFIG.replace(scan_layers=scan_layers, remat="save_dots")
    got = loss_and_grads(init_model(config, jax.random.key(0)), BATCH)
    assert_same_loss_and_grads(got, _reference(), config, BATCH)


@pytest.mark.parametrize(
    ("layout", "mesh"),
    [("fsdp", dict(fsdp=8, data=1)), ("tensor_parallel", dict(tensor=2, data=4))],
)
def test_sharded_training_step_equals_one_device(layout: str, mesh: dict[str, int]) -> None:
    got = sharded_loss_and_grads(TRAIN_CONFIG, layout, BATCH, **mesh)
    assert_same_loss_and_grads(got, _reference(), TRAIN_CONFIG, BATCH)
