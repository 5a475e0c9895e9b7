"""Figures every process reports alike: the slowest process's time, process 0's peak (collectives)."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def slowest_process(seconds: float) -> float:
    """The largest ``seconds`` over all processes (a collective: every process must call it together).

    A step ends when its slowest process ends, so throughput over the run is that process's time.
    """
    if jax.process_count() == 1:
        return seconds

    return float(np.max(multihost_utils.process_allgather(np.asarray(seconds, dtype=np.float64))))


def from_process_zero(value: float) -> float:
    """Process 0's ``value`` on every process (a collective), e.g. a peak each process measured alone."""
    if jax.process_count() == 1:
        return value

    return float(multihost_utils.broadcast_one_to_all(np.asarray(value, dtype=np.float64)))
