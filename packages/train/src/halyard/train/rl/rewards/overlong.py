"""DAPO's soft overlong punishment: a reward of the completion's length in tokens (DAPO, eq. 13)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def overlong_penalty(
    lengths: Sequence[int] | np.ndarray, *, max_completion_length: int, buffer: int
) -> np.ndarray:
    """0 up to ``max_completion_length - buffer`` tokens, then falling linearly to -1 at
    ``max_completion_length``, and -1 beyond (TRL's ``get_soft_overlong_punishment``).

    A completion the sampler cut at ``max_new_tokens`` never gave its answer; DAPO adds this to the other
    rewards so that running long costs reward gradually instead of all at once at the cut.

    Args:
        lengths: each completion's length in tokens, ``[examples]``.
        max_completion_length: ``L_max``, the sampler's ``max_new_tokens``.
        buffer: ``L_cache``, the tokens before ``L_max`` over which the penalty grows; 0 for none.

    Returns:
        float32 ``[examples]``, each in ``[-1, 0]``.

    Raises:
        ValueError: a negative ``buffer`` or one longer than ``max_completion_length``.
    """
    if not 0 <= buffer <= max_completion_length:
        raise ValueError(
            f"overlong buffer {buffer} must lie between 0 and max_completion_length {max_completion_length}"
        )
    lengths = np.asarray(lengths, np.float64)
    start = max_completion_length - buffer
    ramp = (start - lengths) / max(buffer, 1)
    penalty = np.where(lengths <= start, 0.0, np.where(lengths <= max_completion_length, ramp, -1.0))
    return penalty.astype(np.float32)
