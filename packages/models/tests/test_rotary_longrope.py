"""LongRoPE (Phi-3, Phi-3.5, Phi-4-mini) against transformers' Phi3 rotary embedding and a real config."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from float_tolerance import FUNCTION_TERMS, INVERSE_FREQUENCY_TERMS, rotary_tolerance, summation_tolerance
from transformers import Phi3Config
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

from halyard.models.rotary import RotaryConfig, apply_rotary, inverse_frequencies
from halyard.named import named

HEAD_SIZE = 16
MAX_POSITION = 64
ORIGINAL = 16
THETA = 500.0
PHI4_MINI = (
    Path(__file__).parents[2]
    / "export"
    / "tests"
    / "fixtures"
    / "hf-configs"
    / "phi3"
    / "Phi-4-mini-instruct.json"
)

# Per batch: the longest sequence (max position + 1) decides short or long factors for every row.
POSITIONS = {
    "short": [[0, 1, 5, 9, 14], [3, 2, 1, 0, 4]],
    "at_original": [[11, 12, 13, 14, 15], [0, 1, 2, 3, 4]],  # length 16 == original: still short
    "one_past": [[12, 13, 14, 15, 16], [0, 1, 2, 3, 4]],  # length 17: long, for both rows
    "long": [[0, 1, 5, 30, 40], [7, 8, 9, 10, 11]],
}

# One compiled function for every batch: the short/long choice is data-dependent, not a retrace.
_rotate = jax.jit(apply_rotary, static_argnames=("config", "max_position"))


def _factors(count: int, seed: int) -> list[float]:
    return [float(value) for value in np.random.default_rng(seed).uniform(1.0, 8.0, size=count)]


def _scaling(partial_rotary_factor: float, **extra: Any) -> dict[str, Any]:
    pairs = int(HEAD_SIZE * partial_rotary_factor) // 2
    return {
        "rope_type": "longrope",
        "short_factor": _factors(pairs, 0),
        "long_factor": _factors(pairs, 1),
        **extra,
    }


def _phi3_embedding(hf: dict[str, Any]) -> Phi3RotaryEmbedding:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Phi3RotaryEmbedding(Phi3Config(**json.loads(json.dumps(hf))))  # a copy: Phi3Config edits dicts


def _tiny_phi3(scaling: dict[str, Any], partial_rotary_factor: float) -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "num_attention_heads": 64 // HEAD_SIZE,
        "max_position_embeddings": MAX_POSITION,
        "original_max_position_embeddings": ORIGINAL,
        "rope_theta": THETA,
        "partial_rotary_factor": partial_rotary_factor,
        "rope_scaling": scaling,
    }


FREQUENCY_RTOL = INVERSE_FREQUENCY_TERMS * float(np.finfo(np.float32).eps)


def factor_tolerance(factor: float) -> float:
    """LongRoPE's attention factor ``sqrt(1 + log(s) / log(original))`` in float64 by two libraries: two logs,
    the quotients, the sum and the root."""
    return summation_tolerance(factor, 3 * FUNCTION_TERMS + 3, np.float64)


def _check_against_phi3(
    scaling: dict[str, Any], partial_rotary_factor: float, positions: list[list[int]]
) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 3, 5, HEAD_SIZE)).astype(np.float32)  # [batch, heads, pos, head_size]
    position_array = np.array(positions)
    embedding = _phi3_embedding(_tiny_phi3(scaling, partial_rotary_factor))
    cos, sin = embedding(torch.tensor(x), torch.tensor(position_array))
    expected, _ = apply_rotary_pos_emb(torch.tensor(x), torch.tensor(x), cos, sin)
    config = RotaryConfig.from_hf(THETA, scaling, partial_rotary_factor, original_max_position=ORIGINAL)
    actual = _rotate(
        named(jnp.asarray(x), ("batch", "heads", "pos", "head_size")),
        named(jnp.asarray(position_array), ("batch", "pos")),
        config=config,
        max_position=MAX_POSITION,
    )
    bound = rotary_tolerance(x, position_array, expected.numpy())
    np.testing.assert_allclose(actual.array, expected.numpy(), atol=bound, rtol=0)


@pytest.mark.parametrize("batch", list(POSITIONS))
@pytest.mark.parametrize("partial_rotary_factor", [1.0, 0.5], ids=["full", "partial"])
def test_matches_phi3_for_short_and_long_batches(partial_rotary_factor: float, batch: str) -> None:
    _check_against_phi3(_scaling(partial_rotary_factor), partial_rotary_factor, POSITIONS[batch])


@pytest.mark.parametrize(
    "extra",
    [{"attention_factor": 1.3}, {"factor": 2.0}, {"factor": 1.0}],
    ids=["attention_factor", "factor", "factor_one"],
)
@pytest.mark.parametrize("batch", ["short", "long"])
def test_matches_phi3_with_explicit_factors(extra: dict[str, float], batch: str) -> None:
    _check_against_phi3(_scaling(1.0, **extra), 1.0, POSITIONS[batch])


def test_short_and_long_factors_give_different_rotations() -> None:
    config = RotaryConfig.from_hf(THETA, _scaling(1.0), original_max_position=ORIGINAL)
    short, factor = inverse_frequencies(
        config, HEAD_SIZE, max_position=MAX_POSITION, sequence_length=ORIGINAL
    )
    long, _ = inverse_frequencies(config, HEAD_SIZE, max_position=MAX_POSITION, sequence_length=ORIGINAL + 1)
    assert not np.allclose(short, long)
    expected = np.sqrt(1 + np.log(MAX_POSITION / ORIGINAL) / np.log(ORIGINAL))
    assert factor == pytest.approx(expected, rel=0, abs=factor_tolerance(expected))


def test_phi4_mini_config_round_trips_and_matches_transformers() -> None:
    hf = json.loads(PHI4_MINI.read_text())
    config = RotaryConfig.from_hf(
        hf["rope_theta"],
        hf["rope_scaling"],
        hf["partial_rotary_factor"],
        hf["original_max_position_embeddings"],
    )
    head_size = hf["hidden_size"] // hf["num_attention_heads"]
    config.check_head_size(head_size, "Phi-4-mini")
    assert (config.scaling, config.original_max_position, config.partial_rotary_factor) == (
        "longrope",
        4096,
        0.75,
    )
    assert config.short_factor == tuple(hf["rope_scaling"]["short_factor"])
    assert len(config.long_factor or ()) == config.rotary_dim(head_size) // 2 == 48

    theta, scaling = config.to_hf()
    assert scaling == {
        "rope_type": "longrope",
        "short_factor": hf["rope_scaling"]["short_factor"],
        "long_factor": hf["rope_scaling"]["long_factor"],
        "original_max_position_embeddings": 4096,
    }
    assert RotaryConfig.from_hf(theta, scaling, hf["partial_rotary_factor"]) == config

    # The published file and the one written back give transformers the same short and long frequencies.
    for written in (hf, {**hf, "rope_theta": theta, "rope_scaling": scaling}):
        embedding = _phi3_embedding(written)
        short, attention_factor = inverse_frequencies(
            config, head_size, max_position=hf["max_position_embeddings"]
        )
        # float32 frequencies from XLA's power and torch's; the factor in float64 on both sides
        np.testing.assert_allclose(short, embedding.original_inv_freq.numpy(), rtol=FREQUENCY_RTOL, atol=0)
        bound = factor_tolerance(embedding.attention_scaling)
        assert attention_factor == pytest.approx(embedding.attention_scaling, rel=0, abs=bound)
        embedding(torch.zeros(1, 1, head_size), torch.tensor([[4096]]))  # length 4097: transformers switches
        long, _ = inverse_frequencies(
            config, head_size, max_position=hf["max_position_embeddings"], sequence_length=4097
        )
        np.testing.assert_allclose(long, embedding.inv_freq.numpy(), rtol=FREQUENCY_RTOL, atol=0)


def test_top_level_original_max_position_wins_over_the_dict() -> None:
    scaling = _scaling(1.0, original_max_position_embeddings=8)
    assert RotaryConfig.from_hf(THETA, scaling).original_max_position == 8
    assert (
        RotaryConfig.from_hf(THETA, scaling, original_max_position=ORIGINAL).original_max_position == ORIGINAL
    )


def test_factor_lists_of_the_wrong_length_are_named() -> None:
    config = RotaryConfig(scaling="longrope", short_factor=(1.0,) * 3, long_factor=(1.0,) * 8)
    with pytest.raises(ValueError, match=r"rope short_factor has 3 entries .* it needs 8$"):
        config.check_head_size(HEAD_SIZE, "PhiConfig")
    with pytest.raises(ValueError, match=r"long_factor has 8 entries .*rotary_dim 8 .* it needs 4$"):
        apply_rotary(
            named(jnp.zeros((2, HEAD_SIZE)), ("pos", "head_size")),
            named(jnp.arange(2), "pos"),
            RotaryConfig(
                scaling="longrope", short_factor=(1.0,) * 4, long_factor=(1.0,) * 8, partial_rotary_factor=0.5
            ),
            max_position=MAX_POSITION,
        )


def test_bad_longrope_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"type 'longrope' lacks key\(s\) \['long_factor'\]"):
        RotaryConfig.from_hf(THETA, {"rope_type": "longrope", "short_factor": [1.0] * 8})
    with pytest.raises(ValueError, match="longrope needs long_factor"):
        RotaryConfig(scaling="longrope", short_factor=(1.0,) * 8)
    with pytest.raises(ValueError, match="short_factor is longrope's; scaling 'yarn'"):
        RotaryConfig(scaling="yarn", short_factor=(1.0,))
    with pytest.raises(ValueError, match="long_factor must be a non-empty list of positive numbers"):
        RotaryConfig(scaling="longrope", short_factor=(1.0,), long_factor=(1.0, 0.0))


def test_factor_lists_become_hashable_tuples() -> None:
    config = RotaryConfig(scaling="longrope", short_factor=[1, 2], long_factor=[3.0, 4.0])  # type: ignore[arg-type]
    assert config.short_factor == (1.0, 2.0)
    assert hash(config) == hash(
        RotaryConfig(scaling="longrope", short_factor=(1.0, 2.0), long_factor=(3.0, 4.0))
    )
