"""Importance sampling from the sampler's distribution to the trainer's (truncated or masked).

The inference engine reports the log-probability of each token it sampled (``sampler_logps``). The trainer
recomputes the same tokens under the same weights (``old_logps``, the policy the rollouts are meant to come
from). The two differ when the engine's numerics differ from the trainer's, and by more when rollouts run
ahead of training on older weights (``rl.async_steps``); the policy gradient then silently becomes
off-policy. Weighting each token's loss by ``w = pi_old / pi_sampler`` corrects the estimate, and truncating
``w`` at a cap bounds its variance (truncated importance sampling, Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"). This is TRL's ``vllm_importance_sampling_correction``:

- ``token``: one weight per token, ``w_t = exp(old_t - sampler_t)``, clipped to ``[floor, cap]``;
- ``sequence``: one weight per completion, ``exp(sum_t (old_t - sampler_t))``, clipped the same way;
- ``token_mask`` / ``sequence_mask``: weights outside ``[floor, cap]`` become 0 (the token or completion
  drops out of the loss) instead of being clipped.

Both log-probabilities must be of the distribution the tokens were actually drawn from (after temperature
and top-p), or the weights correct for the wrong thing. No gradient flows through the weights.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Num

from halyard.train.rl.spec import IMPORTANCE_CAP, IMPORTANCE_SAMPLING_MODES, ImportanceSampling


class SamplerCorrection(NamedTuple):
    """What `sampler_correction` returns.

    Attributes:
        weights: the importance weights, float ``[sequences, tokens]`` for the token modes, ``[sequences, 1]``
            for the sequence modes (one per completion, broadcast over its tokens), None for ``"none"``.
        metrics: float32 scalars under TRL's names: ``sampling/sampling_logp_difference/mean`` and ``/max``
            (``|old - sampler|`` over the completion tokens) always, and with a correction
            ``sampling/importance_sampling_ratio/min``, ``/mean`` and ``/max`` (over the completion tokens for
            the token modes, over the completions for the sequence modes).
    """

    weights: jax.Array | None
    metrics: dict[str, jax.Array]


def sampler_correction(
    old_logps: Float[Array, "sequences tokens"],
    sampler_logps: Float[Array, "sequences tokens"],
    mask: Num[Array, "sequences tokens"],
    *,
    mode: ImportanceSampling,
    cap: float | None = IMPORTANCE_CAP,
    floor: float | None = None,
) -> SamplerCorrection:
    """The importance weights from the sampler's distribution to ``pi_old`` (see the module docstring).

    Args:
        old_logps: the trainer's log-probability of each completion token under the weights that sampled it.
        sampler_logps: the engine's log-probability of the same tokens; NaN where the engine gave none (that
            token's weight is then 1).
        mask: 1 on completion tokens, 0 on padding.
        mode: ``"none"``, ``"token"``, ``"sequence"``, ``"token_mask"`` or ``"sequence_mask"``.
        cap: the largest weight kept (TRL's ``vllm_importance_sampling_clip_max``); None for no upper bound.
        floor: the smallest weight kept (TRL's ``vllm_importance_sampling_clip_min``); None for no lower bound.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance sampling {mode!r} is not one of {', '.join(IMPORTANCE_SAMPLING_MODES)}")
    old = jax.lax.stop_gradient(old_logps)
    sampler = jax.lax.stop_gradient(sampler_logps)
    valid = mask > 0
    metrics = _difference_metrics(old, sampler, valid)
    if mode == "none":
        return SamplerCorrection(None, metrics)
    # Masked, and NaN (a token the engine could not score) becomes 0: weight 1, no correction.
    log_weights = jnp.nan_to_num((old - sampler) * mask.astype(old.dtype), nan=0.0)
    sequence_level = mode.startswith("sequence")
    if sequence_level:
        log_weights = jnp.sum(log_weights, axis=-1, keepdims=True)
    weights = jnp.exp(log_weights)
    if mode.endswith("mask"):
        outside = jnp.zeros(weights.shape, bool)
        if floor is not None:
            outside |= weights < floor
        if cap is not None:
            outside |= weights > cap
        weights = jnp.where(outside, 0.0, weights)
    elif floor is not None or cap is not None:
        weights = jnp.clip(weights, floor, cap)
    counted = jnp.ones(weights.shape, bool) if sequence_level else valid
    metrics.update(_weight_metrics(weights, counted))
    return SamplerCorrection(weights, metrics)


def _difference_metrics(old: jax.Array, sampler: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
    """``|old - sampler|`` mean and max over the valid tokens the engine scored (0 when there are none)."""
    difference = jnp.abs(old - sampler)
    counted = valid & ~jnp.isnan(difference)
    count = jnp.sum(counted)
    total = jnp.sum(jnp.where(counted, difference, 0.0))
    largest = jnp.max(jnp.where(counted, difference, -jnp.inf))
    return {
        "sampling/sampling_logp_difference/mean": jnp.where(count > 0, total / jnp.maximum(count, 1), 0.0),
        "sampling/sampling_logp_difference/max": jnp.where(count > 0, largest, 0.0),
    }


def _weight_metrics(weights: jax.Array, counted: jax.Array) -> dict[str, jax.Array]:
    """The weights' min, mean and max over the counted entries (0 when there are none)."""
    count = jnp.sum(counted)
    some = count > 0
    prefix = "sampling/importance_sampling_ratio"
    return {
        f"{prefix}/min": jnp.where(some, jnp.min(jnp.where(counted, weights, jnp.inf)), 0.0),
        f"{prefix}/mean": jnp.where(
            some, jnp.sum(jnp.where(counted, weights, 0.0)) / jnp.maximum(count, 1), 0.0
        ),
        f"{prefix}/max": jnp.where(some, jnp.max(jnp.where(counted, weights, -jnp.inf)), 0.0),
    }
