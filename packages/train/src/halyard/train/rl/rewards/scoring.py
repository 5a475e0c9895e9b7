"""Scoring a batch of completions with several reward functions at once, weighted (``rl.rewards`` with
``rl.reward_weights``), and the error a failing reward function ends the run with."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from halyard.train.config.errors import ConfigError
from halyard.train.rl.rewards.registry import NamedReward, load_reward
from halyard.train.user_errors import RunFailure, one_line

_SHOWN_PROMPT_CHARACTERS = 60


class RewardError(RunFailure):
    """A reward function raised, or returned something that is not a number, on one example.

    The message is one line naming the function, the example (its index in the batch, its record when
    the caller gave one, the start of its prompt) and what went wrong; the original exception is the
    ``__cause__``. The trainer catches it and stops with the last checkpoint kept.

    Attributes:
        reward: the ``rl.rewards`` entry of the function.
        example: the example's index in the scored batch.
        record: where the example came from (``file:line``, a record id), or None.
    """

    def __init__(self, message: str, *, reward: str, example: int, record: str | None) -> None:
        super().__init__(message)
        self.reward, self.example, self.record = reward, example, record


class RewardScores(NamedTuple):
    """What `RewardSet.score` returns.

    Attributes:
        total: float32 ``[examples]``, the weighted sum of the functions' rewards (TRL's: a NaN reward
            counts 0), NaN where no function scored the example.
        per_function: float32 ``[examples]`` of each function's rewards by its metric name (NaN: not
            scored), for per-function means and deviations.
    """

    total: np.ndarray
    per_function: dict[str, np.ndarray]


@dataclass(frozen=True)
class RewardSet:
    """Reward functions with weights (`load_rewards`).

    Attributes:
        rewards: the functions, each with its metric name (unique) and its ``rl.rewards`` entry.
        weights: one weight per function.
    """

    rewards: tuple[NamedReward, ...]
    weights: tuple[float, ...]

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        answers: Sequence[str],
        records: Sequence[str] | None = None,
    ) -> RewardScores:
        """Every function's reward of every example and their weighted sum.

        Args:
            prompts: each example's prompt text (a prompt repeated for each of its completions).
            completions: each example's completion text.
            answers: each example's reference answer.
            records: where each example came from, for error messages (``file:line``, an id); optional.

        Raises:
            RewardError: a function raised or returned a value that is not a real number or None.
            ValueError: the sequences differ in length.
        """
        count = len(completions)
        if not len(prompts) == len(answers) == count or (records is not None and len(records) != count):
            raise ValueError(
                f"{len(prompts)} prompts, {count} completions, {len(answers)} answers"
                + ("" if records is None else f" and {len(records)} records")
                + ": one of each per example"
            )
        values = np.full((count, len(self.rewards)), np.nan, np.float32)
        for index, (prompt, completion, answer) in enumerate(zip(prompts, completions, answers, strict=True)):
            record = None if records is None else str(records[index])
            for column, reward in enumerate(self.rewards):
                values[index, column] = _call(reward, prompt, completion, answer, index, record)
        weighted = values * np.asarray(self.weights, np.float32)[None, :]
        total = np.asarray(np.nansum(weighted, axis=1), np.float32)
        total[np.isnan(values).all(axis=1)] = np.nan
        per_function = {reward.name: values[:, column] for column, reward in enumerate(self.rewards)}
        return RewardScores(total, per_function)


def load_rewards(
    specs: Sequence[str], weights: Sequence[float] | None = None, *, format_pattern: str | None = None
) -> RewardSet:
    """The `RewardSet` of ``rl.rewards`` and ``rl.reward_weights``.

    Args:
        specs: the reward functions' names (`halyard.train.rl.rewards.load_reward`).
        weights: one finite weight per function; None weighs each 1.
        format_pattern: the regular expression of a bare ``format``.

    Raises:
        ConfigError: no rewards, a bad name (`load_reward`), or weights that do not match the rewards.
    """
    if not specs:
        raise ConfigError(
            "rl.rewards is empty: name at least one reward (math, exact, format:REGEX or module:function)"
        )
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(
            f"rl.reward_weights has {len(weights)} weights for {len(specs)} rl.rewards ({', '.join(specs)}): "
            "give one weight per reward, or none to weigh each 1"
        )
    if not all(math.isfinite(weight) for weight in weights):
        raise ConfigError(f"rl.reward_weights {list(weights)}: every weight must be a finite number")
    loaded: list[NamedReward] = []
    seen: dict[str, int] = {}
    for spec in specs:
        reward = load_reward(spec, format_pattern=format_pattern)
        seen[reward.name] = seen.get(reward.name, 0) + 1
        if seen[reward.name] > 1:  # two format rewards, say: each keeps its own metrics
            reward = reward._replace(name=f"{reward.name}_{seen[reward.name]}")
        loaded.append(reward)
    return RewardSet(tuple(loaded), tuple(float(weight) for weight in weights))


def _call(
    reward: NamedReward, prompt: str, completion: str, answer: str, index: int, record: str | None
) -> float:
    """One function's reward of one example as a float (NaN: not scored), or a `RewardError`."""

    def failure(what: str) -> RewardError:
        where = f"example {index}" + ("" if record is None else f" (record {record})")
        shown = " ".join(prompt.split())
        if len(shown) > _SHOWN_PROMPT_CHARACTERS:
            shown = shown[: _SHOWN_PROMPT_CHARACTERS - 3] + "..."
        message = f"reward {reward.spec} {what} on {where}, prompt {shown!r}"
        return RewardError(one_line(message), reward=reward.spec, example=index, record=record)

    try:
        value = reward.function(prompt, completion, answer)
    except Exception as error:
        raise failure(f"raised {type(error).__name__}: {one_line(str(error))}") from error
    if value is None:
        return math.nan
    if isinstance(value, numbers.Real) and not math.isinf(float(value)):
        return float(value)
    shown_value = repr(value)[:40]
    raise failure(
        f"returned {shown_value} ({type(value).__name__}), not a finite float (None or NaN: not scored)"
    )
