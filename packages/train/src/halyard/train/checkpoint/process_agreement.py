"""Making every process take the same decision.

Each host has its own clock: if every process decided "is a time-based save due?" alone, they could
disagree and deadlock or save three times (levanter#76). Process 0 decides and broadcasts.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

Broadcast = Callable[[bool], bool]


def broadcast_from_process_zero(decision: bool) -> bool:
    """Process 0's ``decision``, on every process (a collective: all processes must call it together).

    Args:
        decision: this process's value; only process 0's matters.
    """
    if jax.process_count() == 1:
        return decision

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(decision, dtype=np.bool_)))


def true_on_any_process(value: bool) -> bool:
    """True on every process when ``value`` is true on at least one (a collective, like the above).

    Args:
        value: this process's value (e.g. "I received SIGTERM").
    """
    if jax.process_count() == 1:
        return value

    return bool(np.any(multihost_utils.process_allgather(np.asarray(value, dtype=np.bool_))))
