"""The ``math`` reward: is the completion's answer mathematically the reference answer (math-verify).

TRL's ``accuracy_reward`` exactly, one example at a time: the reference answer is parsed with
math-verify's defaults (LaTeX or a plain expression: ``72``, ``\\frac{1}{3}``, ``$x^2$``); the
completion's first LaTeX answer, a ``\\boxed{...}`` first, with units normalised and nothing taken from
text that is not LaTeX (``The answer is 72`` without ``$...$`` or a box has none); math-verify then
compares the two as expressions (``0.5`` is ``\\frac{1}{2}``, ``2x + x^2`` is ``x^2 + 2x``). A reference
answer math-verify cannot parse gives NaN: the completion is not scored (TRL's None), and
`halyard.train.rl.losses.group_advantages` leaves it out.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from typing import Any

# math-verify limits parsing and comparing with signal.alarm, which only the main thread may set:
# elsewhere the limits are off (as in TRL) and so are their warnings.
PARSING_SECONDS = 10
VERIFY_SECONDS = 5


def math_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the completion's answer equals ``answer`` as mathematics, else 0.0; NaN when ``answer``
    does not parse (see the module docstring).

    Args:
        prompt: the prompt (unused: the answer decides).
        completion: the sampled completion's text.
        answer: the reference answer, LaTeX or a plain expression.
    """
    del prompt
    from math_verify import verify

    main_thread = _main_thread()
    gold = _parse_reference(answer, main_thread)
    if not gold:
        return math.nan
    predicted = _parse_completion(completion, main_thread)
    return float(verify(list(gold), predicted, timeout_seconds=VERIFY_SECONDS if main_thread else None))


def _main_thread() -> bool:
    main = threading.current_thread() is threading.main_thread()
    if not main:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return main


@functools.lru_cache(maxsize=4096)
def _parse_reference(answer: str, main_thread: bool) -> tuple[Any, ...]:
    """The parsed reference answer, cached: a group's completions share it."""
    from math_verify import parse

    return tuple(parse(answer, parsing_timeout=PARSING_SECONDS if main_thread else None))


def _parse_completion(completion: str, main_thread: bool) -> list[Any]:
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse

    latex_only = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,  # a boxed answer before any other
        try_extract_without_anchor=False,
    )
    return parse(
        completion,
        extraction_config=[latex_only],
        extraction_mode="first_match",
        parsing_timeout=PARSING_SECONDS if main_thread else None,
    )
