"""From sampled groups to a GRPO train batch: rewards, advantages and the arrays of the step, plus what the
rollouts say about themselves (the metrics the trainer logs beside the step's own).

A batch has ``groups * group_size`` sequences (a prompt and one completion), a prompt's completions side by
side, laid out in rows by `halyard.train.rl.packing.layout_rows`: packed several to a row, or one to a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from halyard.train.rl.config import RlConfig
from halyard.train.rl.losses import group_advantages
from halyard.train.rl.packing import PackedSequence, RowLayout, layout_rows
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


def batch_arrays(scored: ScoredGroups, layout: RowLayout) -> dict[str, np.ndarray]:
    """The step's arrays (`halyard.train.rl.packing.layout_rows`) of ``scored``'s groups, in order."""
    sequences = [
        PackedSequence(list(group.prompt.tokens), list(completion.tokens), list(completion.sampler_logprobs))
        for group in scored.groups
        for completion in group.completions
    ]
    return layout_rows(sequences, scored.advantages, layout)


def row_metrics(arrays: dict[str, np.ndarray], scored: ScoredGroups) -> dict[str, float]:
    """How full the trained rows are: ``train/rows``, ``train/row_width`` and ``train/row_fill`` (the share of
    their tokens that are prompts and completions rather than padding)."""
    rows, width = arrays["tokens"].shape
    tokens = sum(len(g.prompt.tokens) + len(c.tokens) for g in scored.groups for c in g.completions)
    return {
        "train/rows": float(rows),
        "train/row_width": float(width),
        "train/row_fill": tokens / (rows * width),
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
