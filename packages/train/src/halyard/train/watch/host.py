"""The watched step's arrays as the trackers' numbers, and the worst examples of a step, on the host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def flatten_arrays(values: Mapping[str, Any]) -> dict[str, float]:
    """Every value as numbers: a scalar keeps its name, an array ``[d0, d1, ...]`` becomes ``<name>/<i>/<j>...``
    (``grad_norm/layers`` ``[L]`` -> ``grad_norm/layers/0`` ... ``grad_norm/layers/L-1``).

    Args:
        values: name -> number or numpy array (fetched from the device).
    """
    flat: dict[str, float] = {}
    for name, value in values.items():
        array = np.asarray(value, dtype=np.float64)
        if array.ndim == 0:
            flat[name] = float(array)
            continue
        for index in np.ndindex(*array.shape):
            flat[name + "".join(f"/{i}" for i in index)] = float(array[index])
    return flat


NORM_PREFIXES = ("grad_norm/", "param_norm/", "update_norm/", "opt_state_norm/")
"""The watched step's norms per module and per layer (the global ``grad_norm`` etc. have no ``/``)."""


def is_per_part(name: str) -> bool:
    """Whether ``name`` is a watched statistic of one module or layer (a norm per module, ``<name>/layers/<i>``):
    the trackers get them, a one-line summary leaves them out."""
    return name.startswith(NORM_PREFIXES) or "/layers/" in name


def worst_rows(examples: Mapping[str, Any], count: int) -> list[tuple[int, float, int]]:
    """The ``count`` rows of a step with the highest loss per counted token, worst first.

    Args:
        examples: the step's ``metrics["examples"]``: ``loss`` (each row's loss sum) and ``tokens`` (its
            counted tokens), ``[rows]`` each.
        count: how many rows.

    Returns:
        ``(row, mean loss per token, tokens)`` for each; rows without counted tokens are left out.
    """
    losses = np.asarray(examples["loss"], dtype=np.float64)
    tokens = np.asarray(examples["tokens"], dtype=np.float64)
    means = np.where(tokens > 0, losses / np.maximum(tokens, 1.0), -np.inf)
    order = np.argsort(-means, kind="stable")
    return [(int(row), float(means[row]), int(tokens[row])) for row in order[:count] if tokens[row] > 0]
