"""From sampled groups to a GRPO train batch: rewards, advantages and the arrays of the step, plus what the
rollouts say about themselves (the metrics the trainer logs beside the step's own).

A batch has ``groups * group_size`` rows, a prompt's completions side by side. Row ``i`` holds the prompt,
the completion and padding (``tokens [rows, width]``); ``completion_mask`` is 1 on the completion's tokens;
the sampler's log-probability of completion token ``t`` sits at label position ``t - 1`` of
``sampler_logps [rows, width - 1]`` (the position that predicts it).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from halyard.train.rl.config import RlConfig
from halyard.train.rl.losses import group_advantages
from halyard.train.rl.rewards.scoring import RewardSet
from halyard.train.rl.rollouts import Group


@dataclass
class ScoredGroups:
    """Groups with their rewards ``[groups, group_size]`` (the weighted sum, after any overlong penalty), each
    reward function's ``[groups, group_size]``, the advantages and which groups teach nothing."""

    groups: list[Group]
    rewards: np.ndarray
    per_function: dict[str, np.ndarray]
    advantages: np.ndarray
    all_equal: np.ndarray


def score_groups(groups: list[Group], rewards: RewardSet, config: RlConfig) -> ScoredGroups:
    """Score every completion, apply DAPO's overlong penalty, and compute the group advantages.

    Raises:
        RewardError: a reward function raised (named with the example's record).
    """
    size = config.group_size
    flat = [(group, completion) for group in groups for completion in group.completions]
    scores = rewards.score(
        [group.prompt.text for group, _ in flat],
        [completion.text for _, completion in flat],
        [group.prompt.answer for group, _ in flat],
        [group.prompt.where for group, _ in flat],
    )
    total = np.nan_to_num(scores.total, nan=0.0)
    if config.overlong_buffer:
        lengths = np.asarray([len(completion.tokens) for _, completion in flat], np.float32)
        start = config.max_new_tokens - config.overlong_buffer
        total = total - config.overlong_penalty * np.clip(
            (lengths - start) / config.overlong_buffer, 0.0, 1.0
        )
    shaped = total.reshape(len(groups), size)
    result = group_advantages(jnp.asarray(shaped), scale=config.recipe.reward_scale)
    per_function = {name: values.reshape(len(groups), size) for name, values in scores.per_function.items()}
    return ScoredGroups(
        groups, shaped, per_function, np.asarray(result.advantages), np.asarray(result.all_equal)
    )


def batch_arrays(scored: ScoredGroups, width: int) -> dict[str, np.ndarray]:
    """The step's arrays (see the module docstring) of ``scored``'s groups, in order."""
    rows = sum(len(group.completions) for group in scored.groups)
    tokens = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), np.int32)
    sampler = np.zeros((rows, width - 1), np.float32)
    row = 0
    for group in scored.groups:
        prompt = list(group.prompt.tokens)
        for completion in group.completions:
            sequence = prompt + completion.tokens
            tokens[row, : len(sequence)] = sequence
            mask[row, len(prompt) : len(sequence)] = 1
            sampler[row, len(prompt) - 1 : len(sequence) - 1] = completion.sampler_logprobs
            row += 1
    return {
        "tokens": tokens,
        "completion_mask": mask,
        "sampler_logps": sampler,
        "advantages": scored.advantages.reshape(-1).astype(np.float32),
    }


def rollout_metrics(scored: ScoredGroups, config: RlConfig) -> dict[str, float]:
    """What the rollouts of a batch say: rewards (each function's mean and deviation), the share of groups with
    no advantage, pass@k, completion lengths and truncations."""
    completions = [completion for group in scored.groups for completion in group.completions]
    lengths = np.asarray([len(c.tokens) for c in completions], np.float64)
    metrics = {
        "reward/mean": float(scored.rewards.mean()),
        "reward/std": float(scored.rewards.std()),
        "groups/zero_advantage": float(scored.all_equal.mean()),
        f"pass@{config.group_size}": float((scored.rewards.max(axis=1) >= 1.0).mean()),
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated": float(np.mean([c.truncated for c in completions])),
    }
    for name, values in scored.per_function.items():
        metrics[f"reward/{name}/mean"] = float(np.nanmean(values)) if np.isfinite(values).any() else 0.0
        metrics[f"reward/{name}/std"] = float(np.nanstd(values)) if np.isfinite(values).any() else 0.0
    return metrics
