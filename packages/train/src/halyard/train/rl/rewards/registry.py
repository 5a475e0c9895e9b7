"""Reward functions by name, as ``rl.rewards`` lists them: built-ins and user functions.

- ``math``: `math_reward` (math-verify, TRL's ``accuracy_reward``);
- ``exact``: `exact_reward` (the stripped completion is the answer, numbers by value);
- ``format:REGEX``: `FormatReward` (the completion matches the regular expression); a bare ``format``
  takes its expression from the ``format_pattern`` argument;
- ``module.path:function``: a function of ``(prompt, completion, answer)`` returning a float, imported
  from its module (found on the Python path, then in the current folder).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

from halyard.train.config.errors import ConfigError, did_you_mean
from halyard.train.rl.rewards.exact import exact_reward
from halyard.train.rl.rewards.math_answer import math_reward
from halyard.train.rl.rewards.pattern import FormatReward
from halyard.train.user_errors import one_line

RewardFunction = Callable[[str, str, str], float]
"""``(prompt, completion, answer) -> reward``; a NaN or None reward means "not scored"."""

BUILTIN_REWARDS: dict[str, RewardFunction] = {"math": math_reward, "exact": exact_reward}
_FORMAT = "format"


class NamedReward(NamedTuple):
    """A reward function with the names it goes by.

    Attributes:
        name: the short name its metrics carry (``math``, ``format``, a user function's own name).
        spec: what ``rl.rewards`` said (``format:<answer>.*</answer>``, ``my_module:my_reward``).
        function: the function.
    """

    name: str
    spec: str
    function: RewardFunction


def load_reward(spec: str, *, format_pattern: str | None = None) -> NamedReward:
    """The reward function ``spec`` names (see the module docstring).

    Args:
        spec: ``math``, ``exact``, ``format:REGEX``, ``format`` or ``module.path:function``.
        format_pattern: the regular expression of a bare ``format``.

    Raises:
        ConfigError: an unknown name, a ``format`` without an expression or with a bad one, a module that
            is not found or fails to import, a missing attribute, or one that is not a function of three
            arguments; the message is one line that names ``spec`` and the fix.
    """
    spec = spec.strip()
    if spec in BUILTIN_REWARDS:
        return NamedReward(spec, spec, BUILTIN_REWARDS[spec])
    if spec == _FORMAT or spec.startswith(f"{_FORMAT}:"):
        pattern = spec[len(_FORMAT) + 1 :] if spec != _FORMAT else format_pattern
        if not pattern:
            raise ConfigError(
                "rl.rewards: format needs the regular expression the completion must match: write it as "
                "format:REGEX (for example format:<answer>.*</answer>)"
            )
        return NamedReward(_FORMAT, spec, FormatReward(pattern))
    if ":" in spec:
        return NamedReward(spec.rpartition(":")[2], spec, import_reward(spec))
    known = [*BUILTIN_REWARDS, _FORMAT]
    raise ConfigError(
        f"rl.rewards: unknown reward {spec!r}: the built-ins are math, exact and format:REGEX, and a function "
        f"of yours is named module.path:function.{did_you_mean(spec, known)}"
    )


def import_reward(spec: str) -> RewardFunction:
    """The function ``module.path:function`` names, checked to take ``(prompt, completion, answer)``.

    Raises:
        ConfigError: see `load_reward`.
    """
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(
            f"rl.rewards: {spec!r} is not module.path:function (for example my_rewards:correct)"
        )
    module = _import(spec, module_name)
    function = getattr(module, attribute, None)
    if function is None:
        names = [name for name, value in vars(module).items() if callable(value) and not name.startswith("_")]
        raise ConfigError(
            f"rl.rewards: {spec}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
            f"{attribute}.{did_you_mean(attribute, names)}"
        )
    if not callable(function):
        raise ConfigError(
            f"rl.rewards: {spec} is a {type(function).__name__}, not a function of (prompt, completion, answer)"
        )
    try:
        inspect.signature(function).bind("prompt", "completion", "answer")
    except TypeError:
        raise ConfigError(
            f"rl.rewards: {spec} takes {inspect.signature(function)}, but a reward is called with three "
            "arguments: (prompt, completion, answer)"
        ) from None
    except ValueError:
        pass  # no signature to check (a builtin): the first call will tell
    return function


def _import(spec: str, module_name: str) -> object:
    """Imports ``module_name`` from the Python path, then from the current folder (where a user runs
    ``halyard train`` next to their rewards file; a console script does not put it on the path)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):
            raise ConfigError(
                f"rl.rewards: {spec}: no module {error.name} on the Python path or in {here} (run from the "
                "folder that holds it, or add that folder to PYTHONPATH)"
            ) from None
        raise ConfigError(
            f"rl.rewards: {spec}: importing {module_name} failed: {one_line(str(error))}"
        ) from error
    except Exception as error:
        raise ConfigError(
            f"rl.rewards: {spec}: importing {module_name} raised {type(error).__name__}: {one_line(str(error))}"
        ) from error
