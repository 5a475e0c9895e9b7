"""The ``exact`` reward: the completion is the answer, as text or as a number."""

from __future__ import annotations

import re
from fractions import Fraction

# A number as people write answers: an integer (thousands may be grouped with commas), a decimal, a
# fraction a/b, or scientific notation; a sign in front.
_NUMBER = re.compile(r"[+-]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][+-]?\d+)?(/\d+)?")


def exact_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the whole completion, stripped of surrounding whitespace, is the answer (also stripped),
    or when both are numbers of the same value (``72`` = ``72.0`` = ``+72``, ``1,000`` = ``1000``,
    ``0.5`` = ``1/2``; compared exactly as fractions); else 0.0.

    Text around a number is not ignored (``The answer is 72`` is not ``72``): ask for the bare answer, or
    use the ``math`` reward, which finds the answer in a longer completion.

    Args:
        prompt: the prompt (unused).
        completion: the sampled completion's text.
        answer: the reference answer.
    """
    del prompt
    completion, answer = completion.strip(), answer.strip()
    if completion == answer:
        return 1.0
    value, expected = _number(completion), _number(answer)
    return float(value is not None and value == expected)


def _number(text: str) -> Fraction | None:
    """The exact value of ``text`` if it is one number (see `_NUMBER`), else None."""
    if not any(character.isdigit() for character in text) or not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
