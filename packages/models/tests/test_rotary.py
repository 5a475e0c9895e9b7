"""Rotary embeddings against transformers' Llama rotary embedding, for every scaling type but longrope
(test_rotary_longrope.py), and two configurations side by side (Gemma 3's local and global layers)."""

from __future__ import annotations

import contextlib
import warnings

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from float_tolerance import FUNCTION_TERMS, INVERSE_FREQUENCY_TERMS, rotary_tolerance, summation_tolerance
from hypothesis import given, settings
from transformers import Gemma3TextConfig, LlamaConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from halyard.models.rotary import RotaryConfig, apply_rotary, inverse_frequencies
from halyard.named import named
from halyard.named.nn import batch_invariant

HEAD_SIZE = 16
EPS = float(np.finfo(np.float32).eps)
MAX_POSITION = 64
THETA = 500.0

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 32,
        "mscale": 0.7,
        "mscale_all_dim": 0.5,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    "yarn_attention_factor_no_truncate": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 32,
        "attention_factor": 1.3,
        "truncate": False,
    },
}


def _transformers_rotary(x: np.ndarray, positions: np.ndarray, scaling: dict | None) -> np.ndarray:
    config = LlamaConfig.from_dict(
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "head_dim": HEAD_SIZE,
            "max_position_embeddings": MAX_POSITION,
            "rope_theta": THETA,
            "rope_scaling": dict(scaling) if scaling else None,
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedding = LlamaRotaryEmbedding(config)  # fresh: dynamic scaling keeps state between calls
        x_torch = torch.tensor(x)
        cos, sin = embedding(x_torch, torch.tensor(positions))
        rotated, _ = apply_rotary_pos_emb(x_torch, x_torch, cos, sin)
    return rotated.numpy()


@pytest.mark.parametrize("positions", [[0, 1, 5, 30, 63], [3, 40, 100, 150, 7]], ids=["within", "beyond"])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_matches_transformers(name: str, positions: list[int]) -> None:
    scaling = SCALINGS[name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, len(positions), HEAD_SIZE)).astype(
        np.float32
    )  # [batch, heads, pos, head_size]
    position_array = np.array([positions, positions[::-1]])
    expected = _transformers_rotary(x, position_array, scaling)
    config = RotaryConfig.from_hf(THETA, scaling)
    actual = apply_rotary(
        named(jnp.asarray(x), ("batch", "heads", "pos", "head_size")),
        named(jnp.asarray(position_array), ("batch", "pos")),
        config,
        max_position=MAX_POSITION,
    )
    assert actual.axis_names == ("batch", "heads", "pos", "head_size")
    bound = rotary_tolerance(x, position_array, expected)
    np.testing.assert_allclose(actual.array, expected, atol=bound, rtol=0)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_hf_round_trip_and_export_loads_in_transformers(name: str) -> None:
    config = RotaryConfig.from_hf(THETA, SCALINGS[name])
    theta, scaling = config.to_hf()
    assert RotaryConfig.from_hf(theta, scaling) == config
    assert theta == THETA
    # What to_hf writes is a complete rope_scaling for transformers: same frequencies and attention factor.
    hf_config = LlamaConfig.from_dict(
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "head_dim": HEAD_SIZE,
            "max_position_embeddings": MAX_POSITION,
            "rope_theta": theta,
            "rope_scaling": scaling,
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedding = LlamaRotaryEmbedding(hf_config)
    inv_freq, attention_factor = inverse_frequencies(config, HEAD_SIZE, max_position=MAX_POSITION)
    # float32 frequencies from XLA's power and torch's (relative); the attention factor in float64 on both
    # sides (a log, products, a sum, a quotient of two such)
    np.testing.assert_allclose(
        inv_freq, embedding.inv_freq.numpy(), rtol=INVERSE_FREQUENCY_TERMS * EPS, atol=0
    )
    factor_bound = summation_tolerance(embedding.attention_scaling, 2 * FUNCTION_TERMS + 6, np.float64)
    assert attention_factor == pytest.approx(embedding.attention_scaling, rel=0, abs=factor_bound)


def test_partial_rotation_matches_numpy_and_leaves_the_rest() -> None:
    config = RotaryConfig(theta=THETA, partial_rotary_factor=0.5)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 2, HEAD_SIZE)).astype(np.float32)  # [pos, heads, head_size]
    positions = np.array([0, 2, 9, 31])
    actual = np.asarray(
        apply_rotary(
            named(jnp.asarray(x), ("pos", "heads", "head_size")),
            named(jnp.asarray(positions), ("pos",)),
            config,
            max_position=MAX_POSITION,
        ).array
    )
    rotary_dim = HEAD_SIZE // 2
    half = rotary_dim // 2
    inv_freq = 1.0 / THETA ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    expected = x.astype(np.float64).copy()
    for p, position in enumerate(positions):
        for i in range(half):
            angle = position * inv_freq[i]
            first, second = x[p, :, i], x[p, :, i + half]
            expected[p, :, i] = first * np.cos(angle) - second * np.sin(angle)
            expected[p, :, i + half] = second * np.cos(angle) + first * np.sin(angle)
    np.testing.assert_allclose(actual, expected, atol=rotary_tolerance(x, positions, expected), rtol=0)
    np.testing.assert_array_equal(actual[..., rotary_dim:], x[..., rotary_dim:])


@settings(max_examples=20, deadline=None)
@given(
    st.integers(0, 200),
    st.integers(0, 200),
    st.integers(0, 50),
    st.sampled_from(["default", "linear", "llama3"]),
)
def test_scores_depend_only_on_relative_position(
    query_position: int, key_position: int, shift: int, name: str
) -> None:
    config = RotaryConfig.from_hf(THETA, SCALINGS[name])
    rng = np.random.default_rng(2)
    query = named(jnp.asarray(rng.normal(size=(1, HEAD_SIZE)), jnp.float32), ("pos", "head_size"))
    key = named(jnp.asarray(rng.normal(size=(1, HEAD_SIZE)), jnp.float32), ("pos", "head_size"))

    q_norm, k_norm = float(jnp.linalg.norm(query.array)), float(jnp.linalg.norm(key.array))

    def score(offset: int) -> float:
        q = apply_rotary(query, named(jnp.asarray([query_position + offset]), "pos"), config, max_position=64)
        k = apply_rotary(key, named(jnp.asarray([key_position + offset]), "pos"), config, max_position=64)
        # A rotation keeps each pair's length whatever its angle's error: only cos and sin's own errors (and
        # the rotation's products and sum) scale it, then both norms' squares and roots.
        bound = summation_tolerance(q_norm, FUNCTION_TERMS + 3) + 2 * summation_tolerance(
            q_norm, HEAD_SIZE + FUNCTION_TERMS
        )
        assert float(jnp.linalg.norm(q.array)) == pytest.approx(q_norm, rel=0, abs=bound)
        return float(jnp.sum(q.array * k.array))

    # Each pair's score is |q_pair| |k_pair| cos(the angles' difference): an angle errs by its position times
    # an inverse frequency (at most 1) times INVERSE_FREQUENCY_TERMS eps, moving the score by at most its
    # pair's |q| |k| times that; cos and sin's own errors and the dot's HEAD_SIZE roundings add theirs. Over
    # the pairs |q_pair| |k_pair| sums to at most |q| |k|; two scores, each within this of the exact.
    def score_tolerance(offset: int) -> float:
        angles = (query_position + offset + key_position + offset) * INVERSE_FREQUENCY_TERMS
        return summation_tolerance(q_norm * k_norm, angles + 2 * (FUNCTION_TERMS + 3) + HEAD_SIZE)

    bound = score_tolerance(0) + score_tolerance(shift)
    assert score(0) == pytest.approx(score(shift), rel=0, abs=bound)


def test_inverse_frequencies_of_default_rope() -> None:
    inv_freq, attention_factor = inverse_frequencies(RotaryConfig(theta=10000.0), 8, max_position=16)
    # 10000 to the powers 0, 1/4, 1/2, 3/4 (exact exponents) and the reciprocal, in float32
    np.testing.assert_allclose(inv_freq, [1.0, 0.1, 0.01, 0.001], rtol=(FUNCTION_TERMS + 1) * EPS, atol=0)
    assert attention_factor == 1.0


def test_unknown_rope_type_is_named() -> None:
    with pytest.raises(ValueError, match="'proportional' is not supported"):
        RotaryConfig.from_hf(THETA, {"rope_type": "proportional", "factor": 2.0})


def test_unknown_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['low_freq_factor'\]"):
        RotaryConfig.from_hf(THETA, {"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0})


def test_legacy_type_key_is_read() -> None:
    assert RotaryConfig.from_hf(THETA, {"type": "linear", "factor": 4.0}).factor == 4.0


def test_bad_config_values_are_refused() -> None:
    with pytest.raises(ValueError, match="scaling 'ntk' is unknown"):
        RotaryConfig(scaling="ntk")
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RotaryConfig(partial_rotary_factor=0.0)


def test_positions_with_axes_x_lacks_are_refused() -> None:
    x = named(jnp.zeros((3, HEAD_SIZE)), ("pos", "head_size"))
    with pytest.raises(ValueError, match="positions has axes \\['batch'\\]"):
        apply_rotary(x, named(jnp.zeros((2, 3), jnp.int32), ("batch", "pos")), RotaryConfig(), max_position=8)


def test_two_configurations_side_by_side_match_gemma3() -> None:
    # Gemma 3: global layers rope_theta 1e6 with linear factor 8, local (sliding) layers 1e4 unscaled. The
    # model holds two RotaryConfigs; one jitted function called with each in turn must not mix them.
    hf_config = Gemma3TextConfig.from_dict(  # the keys of the published Gemma 3 (4B+) config.json files
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": HEAD_SIZE,
            "num_hidden_layers": 6,
            "max_position_embeddings": MAX_POSITION,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedding = Gemma3RotaryEmbedding(hf_config)
    configs = {
        "full_attention": RotaryConfig.from_hf(1e6, {"rope_type": "linear", "factor": 8.0}),
        "sliding_attention": RotaryConfig.from_hf(1e4, None),
    }
    rotate = jax.jit(apply_rotary, static_argnames=("config", "max_position"))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 5, HEAD_SIZE)).astype(np.float32)  # [batch, heads, pos, head_size]
    positions = np.array([[0, 1, 5, 30, 63], [7, 8, 9, 10, 11]])
    x_named = named(jnp.asarray(x), ("batch", "heads", "pos", "head_size"))
    positions_named = named(jnp.asarray(positions), ("batch", "pos"))
    results = {}
    for layer_type in ("full_attention", "sliding_attention", "full_attention"):
        cos, sin = embedding(torch.tensor(x), torch.tensor(positions), layer_type)
        expected, _ = apply_rotary_pos_emb(torch.tensor(x), torch.tensor(x), cos, sin)
        actual = rotate(x_named, positions_named, config=configs[layer_type], max_position=MAX_POSITION)
        bound = rotary_tolerance(x, positions, expected.numpy())
        np.testing.assert_allclose(actual.array, expected.numpy(), atol=bound, rtol=0)
        results[layer_type] = np.asarray(actual.array)
    assert not np.allclose(results["full_attention"], results["sliding_attention"], atol=1e-3)


def test_inside_batch_invariant_a_positions_rotation_does_not_depend_on_the_others() -> None:
    """Inside `batch_invariant` the rotation runs in the context's blocks of rows (`in_row_blocks`): the first
    rows of 40 get the bits they get alone or among 8 (a partial rotation too), within rounding of the plain
    rotation."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 2, 64)).astype(np.float32)
    positions = rng.integers(0, 512, 40).astype(np.int32)

    def rotate(config: RotaryConfig, invariant: bool):
        def apply(x: jax.Array, positions: jax.Array) -> jax.Array:
            with batch_invariant() if invariant else contextlib.nullcontext():
                rotated = apply_rotary(
                    named(x, ("pos", "kv_heads", "head_size")), named(positions, ("pos",)), config,
                    max_position=512,
                )  # fmt: skip
                return rotated.array

        return jax.jit(apply)

    for config in (RotaryConfig(), RotaryConfig(partial_rotary_factor=0.5)):
        invariant = rotate(config, True)
        full = np.asarray(invariant(x, positions))
        for count in (1, 8, 33):
            assert np.asarray(invariant(x[:count], positions[:count])).tobytes() == full[:count].tobytes()
        plain = np.asarray(rotate(config, False)(x, positions))
        np.testing.assert_allclose(
            full, plain, rtol=0, atol=summation_tolerance(2 * np.abs(x).max(), 2 + FUNCTION_TERMS)
        )
