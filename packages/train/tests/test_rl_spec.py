"""RL's settings are one resolved spec (`halyard.train.rl.spec`): every default is read from there and the
``rl:`` section, `policy_loss`, `sampler_correction` and the advantages agree with it (and with TRL's own
defaults where TRL has the setting)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import jax.numpy as jnp
import numpy as np
import pytest

from halyard.train.rl import spec
from halyard.train.rl.config import RlConfig
from halyard.train.rl.importance import sampler_correction
from halyard.train.rl.losses import group_advantages, policy_loss


def _default(function: typing.Callable, name: str) -> object:
    return inspect.signature(function).parameters[name].default


def test_every_default_is_the_specs() -> None:
    config = RlConfig()
    assert config.clip_low == config.clip_high == spec.CLIP
    assert config.importance_cap == spec.IMPORTANCE_CAP
    assert _default(policy_loss, "clip_low") == _default(policy_loss, "clip_high") == spec.CLIP
    assert _default(policy_loss, "importance_cap") == spec.IMPORTANCE_CAP
    assert _default(sampler_correction, "cap") == spec.IMPORTANCE_CAP
    assert _default(policy_loss, "importance_sampling") == config.importance_sampling == "none"
    assert spec.RECIPES[_default(policy_loss, "loss_type")] == spec.RECIPES[config.loss]  # type: ignore[index]
    assert _default(group_advantages, "scale") == config.recipe.reward_scale


def test_the_choices_agree_with_their_types_and_every_one_runs() -> None:
    assert typing.get_args(spec.ImportanceSampling) == spec.IMPORTANCE_SAMPLING_MODES
    assert typing.get_args(spec.LossType) == spec.LOSS_TYPES
    assert {recipe.normalizer for recipe in spec.RECIPES.values()} == set(spec.LOSS_TYPES)
    assert {recipe.level for recipe in spec.RECIPES.values()} == set(typing.get_args(spec.RatioLevel))
    assert tuple(spec.RECIPES) == spec.LOSSES
    rng = np.random.default_rng(0)
    logps = jnp.asarray(rng.normal(-1.0, 0.1, (4, 5)), jnp.float32)
    sampler = logps + jnp.asarray(rng.normal(0.0, 0.3, (4, 5)), jnp.float32)
    mask = jnp.ones((4, 5), jnp.float32)
    for mode in spec.IMPORTANCE_SAMPLING_MODES:
        config = RlConfig(importance_sampling=mode)  # the section accepts every mode importance.py computes
        correction = sampler_correction(logps, sampler, mask, mode=config.importance_sampling)  # type: ignore[arg-type]
        assert (correction.weights is None) == (mode == "none")
        if correction.weights is not None:
            assert float(jnp.max(correction.weights)) <= config.importance_cap
    rewards = jnp.asarray(rng.integers(0, 2, (2, 2)), jnp.float32)
    for loss in spec.LOSSES:
        recipe = RlConfig(loss=loss).recipe
        advantages = group_advantages(rewards, scale=recipe.reward_scale).advantages.reshape(-1)
        result = policy_loss(
            logps + 0.01,
            logps,
            sampler,
            advantages,
            mask,
            loss_type=recipe.normalizer,
            level=recipe.level,
            max_completion_length=5,
        )
        assert np.isfinite(float(result.loss)), loss
    assert RlConfig(loss="gspo").recipe.level == "sequence"
    assert RlConfig(loss="dr_grpo").recipe.reward_scale == "none"
    with pytest.raises(ValueError, match="rl.importance_sampling='tokens': use one of none, token, sequence"):
        RlConfig(importance_sampling="tokens")


def test_the_defaults_are_trls() -> None:
    trl = pytest.importorskip("trl")
    fields = {field.name: field.default for field in dataclasses.fields(trl.GRPOConfig)}
    assert fields["vllm_importance_sampling_clip_max"] == spec.IMPORTANCE_CAP
    assert fields["epsilon"] == spec.CLIP
    assert fields["scale_rewards"] == spec.RECIPES["grpo"].reward_scale
    assert fields["importance_sampling_level"] == spec.RECIPES["grpo"].level
