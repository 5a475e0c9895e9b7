"""The GRPO family's advantages and policy loss, as functions of per-token log-probabilities.

A batch holds ``groups`` prompts with ``group_size`` sampled completions each, flattened to ``sequences =
groups * group_size`` rows (a prompt's completions next to each other) of ``tokens`` completion positions
with a 0/1 ``mask``. In the notation of the GRPO (Shao et al. 2024), DAPO (Yu et al. 2025) and GSPO
(Zheng et al. 2025) papers, completion ``i`` of a group gets the advantage

    A_i = (R_i - mean(R)) / (std(R) + eps)           (Dr. GRPO, Liu et al. 2025: without the std)

and its token ``t`` the ratio ``r_i,t = pi_theta / pi_old`` of the trained policy to the one that sampled
it (GSPO: one ratio per completion, ``exp`` of the mean log-ratio over its tokens), and the loss

    L_i,t = -min(r_i,t A_i, clip(r_i,t, 1 - eps_low, 1 + eps_high) A_i) * w_i,t + beta * KL_i,t

with ``w`` the sampler's importance weight (`halyard.train.rl.importance`) and ``KL`` the k3 estimator
``exp(ref - logp) - (ref - logp) - 1`` against the frozen reference. The loss types differ only in how
the ``L_i,t`` are averaged (TRL's ``loss_type``):

- ``grpo``: the mean over each completion's tokens, then over completions;
- ``bnpo``: the sum over the batch's tokens / the batch's tokens;
- ``dr_grpo``: the sum / (sequences * max_completion_length), a constant (no length bias);
- ``dapo``: the sum / the tokens of the whole generation batch (``total_tokens``, across micro-batches
  and devices).

The arithmetic is TRL 1.16's ``GRPOTrainer`` (``_generate_and_score_completions`` and ``_compute_loss``),
and packages/train/tests/test_rl_losses.py holds the two equal on identical inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Num

from halyard.train.rl.importance import sampler_correction
from halyard.train.rl.spec import (
    CLIP,
    IMPORTANCE_CAP,
    LOSS_TYPES,
    ImportanceSampling,
    LossType,
    RatioLevel,
    RewardScale,
)


class GroupAdvantages(NamedTuple):
    """What `group_advantages` returns.

    Attributes:
        advantages: float ``[groups, group_size]``, each completion's advantage (0 for an unscored one).
        all_equal: bool ``[groups]``, True where a group's scored rewards are all equal or fewer than two
            are scored: every advantage in it is 0 and the group teaches nothing. DAPO's dynamic sampling
            drops these groups; their share is TRL's ``frac_reward_zero_std`` (which does not count groups
            with fewer than two scored rewards).
    """

    advantages: jax.Array
    all_equal: jax.Array


def group_advantages(
    rewards: Float[Array, "groups group_size"], *, scale: RewardScale = "group", eps: float = 1e-4
) -> GroupAdvantages:
    """Each completion's reward minus its group's mean, divided by a standard deviation (or not).

    The standard deviation is the unbiased one (Bessel's correction, TRL's ``nanstd``); a group of one
    completion has standard deviation 0. A NaN reward means the completion could not be scored (TRL's
    ``None``, `halyard.train.rl.rewards`): it is left out of the means and deviations and its advantage
    is 0, as are those of a group with fewer than two scored completions.

    A group whose rewards are all equal gets advantages of exactly 0. TRL computes them as the others: the
    float32 mean of equal rewards can be a rounding off them (three of 2.9), which leaves advantages of
    about 1e-7 / (1e-7 + eps), -0.0024 there, and a deviation its ``isclose(std, 0)`` does not call 0.

    Args:
        rewards: ``rewards[g, i]`` is the reward of prompt ``g``'s completion ``i``.
        scale: ``"group"`` divides by each group's standard deviation (GRPO), ``"batch"`` by the whole
            batch's (the mean stays the group's), ``"none"`` does not divide (Dr. GRPO). TRL's
            ``scale_rewards``.
        eps: added to the standard deviation before dividing (TRL's 1e-4).

    Raises:
        ValueError: an unknown ``scale``.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"rewards scale {scale!r} is not one of group, batch, none")
    centred = rewards - jnp.nanmean(rewards, axis=1, keepdims=True)
    group_std = _unbiased_nanstd(rewards, axis=1)
    if scale == "group":
        centred = centred / (group_std + eps)
    elif scale == "batch":
        centred = centred / (_unbiased_nanstd(rewards.reshape(-1), axis=0) + eps)
    scored = jnp.sum(~jnp.isnan(rewards), axis=1)
    all_equal = (jnp.nanmin(rewards, axis=1) == jnp.nanmax(rewards, axis=1)) | (scored < 2)
    advantages = jnp.where(all_equal[:, None], 0.0, jnp.nan_to_num(centred, nan=0.0))
    return GroupAdvantages(advantages, all_equal)


def _unbiased_nanstd(values: jax.Array, *, axis: int) -> jax.Array:
    """The standard deviation of the non-NaN values with Bessel's correction along ``axis`` (kept): NaN
    for fewer than two such values, 0 when ``axis`` has one entry (TRL's ``nanstd`` and its special case)."""
    if values.shape[axis] < 2:
        return jnp.zeros_like(jnp.nanmean(values, axis=axis, keepdims=True))
    count = jnp.sum(~jnp.isnan(values), axis=axis, keepdims=True).astype(values.dtype)
    mean = jnp.nanmean(values, axis=axis, keepdims=True)
    correction = jnp.where(count > 1, count / jnp.maximum(count - 1, 1), jnp.nan)
    return jnp.sqrt(jnp.nanmean((values - mean) ** 2, axis=axis, keepdims=True) * correction)


class PolicyLoss(NamedTuple):
    """What `policy_loss` returns.

    Attributes:
        loss: the scalar loss, ``loss_sum / normalizer``.
        metrics: float32 scalars under TRL's names. ``clip_ratio/low_mean``, ``clip_ratio/high_mean`` and
            ``clip_ratio/region_mean``: the share of tokens (completions with ``level="sequence"``) whose
            ratio is clipped below (negative advantage), above (positive advantage), or either;
            ``clip_ratio/low_min`` and ``clip_ratio/high_max``: the least and largest such share of one
            completion; ``kl`` (with reference log-probs): the mean of the KL term as added to the loss;
            the sampler's ``sampling/...`` metrics (with sampler log-probs, `sampler_correction`).
        loss_sum: the loss before normalising: the sum over completions of their token means (``grpo``) or
            the sum over tokens (the others).
        normalizer: what ``loss_sum`` is divided by: completions (``grpo``), tokens (``bnpo``, ``dapo``: the
            batch's or ``total_tokens``), completions * ``max_completion_length`` (``dr_grpo``). A train step
            that accumulates micro-batches adds both and divides at the end, which is each loss of the whole
            batch (``bnpo`` so accumulated is ``dapo``; TRL's ``bnpo`` averages the micro-batches' means).
    """

    loss: jax.Array
    metrics: dict[str, jax.Array]
    loss_sum: jax.Array
    normalizer: jax.Array


def policy_loss(
    logps: Float[Array, "sequences tokens"],
    old_logps: Float[Array, "sequences tokens"] | None,
    sampler_logps: Float[Array, "sequences tokens"] | None,
    advantages: Float[Array, " sequences"],
    mask: Num[Array, "sequences tokens"],
    reference_logps: Float[Array, "sequences tokens"] | None = None,
    *,
    loss_type: LossType = "grpo",
    clip_low: float = CLIP,
    clip_high: float = CLIP,
    kl_beta: float = 0.0,
    kl_importance_weighted: bool = True,
    importance_sampling: ImportanceSampling = "none",
    importance_cap: float | None = IMPORTANCE_CAP,
    importance_floor: float | None = None,
    level: RatioLevel = "token",
    ratio_cap: float | None = None,
    max_completion_length: int | None = None,
    total_tokens: jax.Array | float | None = None,
) -> PolicyLoss:
    """The clipped policy-gradient loss of a batch of completions (see the module docstring).

    Gradients flow through ``logps`` only. Jit it with the keyword options static (``functools.partial``).

    Args:
        logps: the trained policy's log-probability of each completion token (``pi_theta``).
        old_logps: the trainer's log-probability of the tokens under the weights that sampled them
            (``pi_old``); None when those are the current weights (then ``logps`` without gradient).
        sampler_logps: the inference engine's log-probability of the tokens, for ``importance_sampling``
            and the ``sampling/...`` metrics; None without them.
        advantages: each completion's advantage (`group_advantages`, flattened).
        mask: 1 on completion tokens, 0 on padding (and on what is not trained, such as tool output).
        reference_logps: the frozen reference's log-probabilities, needed when ``kl_beta`` is not 0.
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"``: the normaliser.
        clip_low: ``eps_low``, ratios below ``1 - clip_low`` are clipped (TRL's ``epsilon``).
        clip_high: ``eps_high``, ratios above ``1 + clip_high`` are clipped (TRL's ``epsilon_high``).
        kl_beta: the weight of the k3 KL term against the reference (TRL's ``beta``); 0 for none.
        kl_importance_weighted: multiply the KL term by the ratio ``r`` (TRL's ``use_bias_correction_kl``).
        importance_sampling: the sampler correction, ``"none"``, ``"token"``, ``"sequence"`` (truncated)
            or ``"token_mask"``, ``"sequence_mask"`` (`sampler_correction`).
        importance_cap: the largest sampler weight kept (TRL's ``vllm_importance_sampling_clip_max``).
        importance_floor: the smallest sampler weight kept (``vllm_importance_sampling_clip_min``).
        level: ``"token"`` (a ratio per token) or ``"sequence"`` (GSPO's, per completion).
        ratio_cap: two-sided clipping (INTELLECT-2; TRL's ``delta``): the unclipped ratio is capped here
            too, so a negative advantage cannot push a very large ratio further; None for plain clipping.
        max_completion_length: the sampler's ``max_new_tokens``, ``dr_grpo``'s constant.
        total_tokens: ``dapo``'s normaliser, the completion tokens of the whole generation batch (all its
            micro-batches and devices); by default this batch's.

    Raises:
        ValueError: an unknown option; ``dr_grpo`` without ``max_completion_length``; ``kl_beta`` without
            ``reference_logps``; importance sampling without ``sampler_logps``.
    """
    _check_options(loss_type, level, kl_beta, reference_logps, importance_sampling, sampler_logps)
    mask = mask.astype(logps.dtype)
    old = jax.lax.stop_gradient(logps if old_logps is None else old_logps)
    ratio = _ratio(logps, old, mask, level)  # [sequences, tokens], or [sequences, 1] for GSPO
    advantage = advantages[:, None]
    unclipped = ratio if ratio_cap is None else _clamp(ratio, None, ratio_cap)
    per_token = -jnp.minimum(
        unclipped * advantage, _clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantage
    )
    metrics: dict[str, jax.Array] = {}
    if sampler_logps is not None:
        per_token, metrics = _sampler_weighted(
            per_token, old, sampler_logps, mask, importance_sampling, importance_cap, importance_floor
        )
    if reference_logps is not None:
        kl = _k3_kl(logps, reference_logps, ratio if kl_importance_weighted else None)
        metrics["kl"] = _masked_mean(kl, mask)
        per_token = per_token + kl_beta * kl
    per_token = jnp.broadcast_to(per_token, mask.shape) * mask
    loss_sum = _summed(per_token, mask, loss_type)
    normalizer = loss_normalizer(
        mask, loss_type=loss_type, max_completion_length=max_completion_length, total_tokens=total_tokens
    )
    # TRL's clip counts use the ratio after two-sided clipping's cap.
    metrics.update(_clip_metrics(jax.lax.stop_gradient(unclipped), advantage, mask, clip_low, clip_high))
    return PolicyLoss(loss_sum / normalizer, metrics, loss_sum, normalizer)


def _sampler_weighted(
    per_token: jax.Array,
    old: jax.Array,
    sampler_logps: jax.Array,
    mask: jax.Array,
    mode: ImportanceSampling,
    cap: float | None,
    floor: float | None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``per_token`` times the sampler's importance weights (`sampler_correction`), and its metrics."""
    correction = sampler_correction(old, sampler_logps, mask, mode=mode, cap=cap, floor=floor)
    if correction.weights is not None:
        per_token = per_token * correction.weights
    return per_token, dict(correction.metrics)


def _ratio(logps: jax.Array, old: jax.Array, mask: jax.Array, level: RatioLevel) -> jax.Array:
    """``pi_theta / pi_old`` per token, or per completion (GSPO: the exp of the mean log-ratio)."""
    log_ratio = logps - old
    if level == "sequence":
        log_ratio = jnp.sum(log_ratio * mask, axis=-1, keepdims=True) / _at_least_one(
            jnp.sum(mask, axis=-1, keepdims=True)
        )
    return jnp.exp(log_ratio)


def _k3_kl(logps: jax.Array, reference_logps: jax.Array, ratio: jax.Array | None) -> jax.Array:
    """The k3 estimate ``exp(ref - logp) - (ref - logp) - 1`` per token, times ``ratio`` when given."""
    reference = jax.lax.stop_gradient(reference_logps)
    kl = jnp.exp(reference - logps) - (reference - logps) - 1.0
    return kl if ratio is None else kl * ratio


def _summed(per_token: jax.Array, mask: jax.Array, loss_type: str) -> jax.Array:
    """The loss before its normaliser: the sum of the completions' token means (grpo) or of every token."""
    if loss_type == "grpo":
        return jnp.sum(jnp.sum(per_token, -1) / _at_least_one(jnp.sum(mask, -1)))
    return jnp.sum(per_token)


def loss_normalizer(
    mask: Num[Array, "sequences tokens"],
    *,
    loss_type: LossType,
    max_completion_length: int | None = None,
    total_tokens: jax.Array | float | None = None,
) -> Float[Array, ""]:
    """What ``loss_type`` divides the summed loss by (`PolicyLoss.normalizer`), at least 1.

    Raises:
        ValueError: an unknown ``loss_type``, or ``dr_grpo`` without ``max_completion_length``.
    """
    sequences = mask.shape[0]
    if loss_type == "grpo":
        return jnp.asarray(sequences, jnp.float32)
    if loss_type == "bnpo":
        return _at_least_one(jnp.sum(mask.astype(jnp.float32)))
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError(
                "loss dr_grpo divides by sequences * max_completion_length: pass max_completion_length"
            )
        return jnp.asarray(sequences * max_completion_length, jnp.float32)
    if loss_type == "dapo":
        tokens = jnp.sum(mask.astype(jnp.float32)) if total_tokens is None else total_tokens
        return _at_least_one(jnp.asarray(tokens, jnp.float32))
    raise ValueError(f"loss {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")


def _check_options(
    loss_type: str,
    level: str,
    kl_beta: float,
    reference_logps: jax.Array | None,
    importance_sampling: str,
    sampler_logps: jax.Array | None,
) -> None:
    """Refuses option combinations `policy_loss` cannot compute, naming the fix."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    if level not in ("token", "sequence"):
        raise ValueError(f"ratio level {level!r} is not one of token, sequence (GSPO)")
    if kl_beta != 0.0 and reference_logps is None:
        raise ValueError(f"kl_beta {kl_beta} needs reference_logps (the frozen reference's log-probs)")
    if importance_sampling != "none" and sampler_logps is None:
        raise ValueError(f"importance sampling {importance_sampling!r} needs sampler_logps (the engine's)")


def _clamp(values: jax.Array, low: float | None, high: float | None) -> jax.Array:
    """``torch.clamp``: the gradient is 1 inside ``[low, high]`` bounds included (``jnp.clip`` halves it
    on a bound, and a ratio of exactly ``1 + eps`` must get the gradient TRL gives it)."""
    if low is not None:
        values = jnp.where(values < low, low, values)
    if high is not None:
        values = jnp.where(values > high, high, values)
    return values


def _at_least_one(values: jax.Array) -> jax.Array:
    return jnp.maximum(values, 1.0)


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over completion tokens; over completions for a per-completion ``[sequences, 1]`` value."""
    values = jax.lax.stop_gradient(values)
    if values.shape[1] == 1:
        return jnp.mean(values)
    return jnp.sum(values * mask) / _at_least_one(jnp.sum(mask))


def _clip_metrics(
    ratio: jax.Array, advantage: jax.Array, mask: jax.Array, clip_low: float, clip_high: float
) -> dict[str, jax.Array]:
    """The shares of clipped ratios, as TRL's ``_compute_loss`` logs them."""
    low = ((ratio < 1.0 - clip_low) & (advantage < 0)).astype(jnp.float32)
    high = ((ratio > 1.0 + clip_high) & (advantage > 0)).astype(jnp.float32)
    region = jnp.maximum(low, high)
    return {
        "clip_ratio/low_mean": _masked_mean(low, mask),
        "clip_ratio/high_mean": _masked_mean(high, mask),
        "clip_ratio/region_mean": _masked_mean(region, mask),
        "clip_ratio/low_min": _per_sequence_extreme(low, mask, largest=False),
        "clip_ratio/high_max": _per_sequence_extreme(high, mask, largest=True),
    }


def _per_sequence_extreme(flags: jax.Array, mask: jax.Array, *, largest: bool) -> jax.Array:
    """The least or largest per-completion share of ``flags``, over completions with tokens (NaN if none)."""
    extreme = jnp.max if largest else jnp.min
    if flags.shape[1] == 1:
        return extreme(flags)
    tokens = jnp.sum(mask, -1)
    shares = jnp.sum(flags * mask, -1) / _at_least_one(tokens)
    shares = jnp.where(tokens > 0, shares, -jnp.inf if largest else jnp.inf)
    return jnp.where(jnp.any(tokens > 0), extreme(shares), jnp.nan)
