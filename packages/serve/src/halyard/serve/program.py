"""A step program's static shape, its inputs and its outputs (host side), as the `ModelRunner` runs them."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from halyard.serve.sampler import RowSettings


class StepInputs(NamedTuple):
    """One program's inputs (numpy, host side).

    Attributes:
        tokens: int32 ``[rows, tokens]``.
        positions: int32 ``[rows, tokens]``: each token's position, -1 for padding.
        page_table: int32 ``[rows, seq_pages]``.
        last: int32 ``[rows]``: the index (in ``tokens``) of the token whose logits are sampled from.
        settings: the rows' `RowSettings` as numpy arrays.
        next_tokens: int32 ``[rows, tokens]``: the token following each fed token (for prompt log-probs),
            -1 where unknown; None when no row asks for prompt log-probs.
    """

    tokens: np.ndarray
    positions: np.ndarray
    page_table: np.ndarray
    last: np.ndarray
    settings: RowSettings
    next_tokens: np.ndarray | None


class StepOutputs(NamedTuple):
    """One program's results (numpy): the drawn token per row with its log-probabilities and top
    alternatives (`halyard.serve.sampler.Drawn`), and the prompt log-probs (``[rows, tokens]`` and
    ``[rows, tokens, 20]`` top alternatives) when asked for."""

    token: np.ndarray
    logprob: np.ndarray
    sampled_logprob: np.ndarray
    top_tokens: np.ndarray
    top_logprobs: np.ndarray
    next_logprob: np.ndarray | None
    next_top_tokens: np.ndarray | None
    next_top_logprobs: np.ndarray | None


def round_up_power_of_two(value: int, smallest: int = 1) -> int:
    """The smallest power of two at least ``value`` and ``smallest``."""
    size = max(1, smallest)
    while size < value:
        size *= 2
    return size


@dataclasses.dataclass(frozen=True)
class ProgramShape:
    """The static shape of one compiled program."""

    rows: int
    tokens: int
    seq_pages: int
    prompt_logprobs: bool
