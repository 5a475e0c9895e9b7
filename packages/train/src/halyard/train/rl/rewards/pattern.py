"""The ``format`` reward: the completion has the shape a regular expression describes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from halyard.train.config.errors import ConfigError


@dataclass(frozen=True)
class FormatReward:
    """1.0 when the completion, stripped of surrounding whitespace, matches ``pattern`` as a whole (``.``
    matching newlines too), else 0.0. For example ``<think>.*</think>\\s*<answer>.*</answer>``.

    A class rather than a closure so that it pickles (rewards scored in other processes).

    Attributes:
        pattern: a Python regular expression.

    Raises:
        ConfigError: ``pattern`` is not a regular expression (names it and says why).
    """

    pattern: str
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern, re.DOTALL)
        except re.error as error:
            raise ConfigError(
                f"rl.rewards: format:{self.pattern} is not a regular expression ({error})"
            ) from None
        object.__setattr__(self, "_compiled", compiled)

    def __call__(self, prompt: str, completion: str, answer: str) -> float:
        return float(self._compiled.fullmatch(completion.strip()) is not None)
