"""A mixture's per-source figures under their names: ``train/<source>/loss`` and ``train/<source>/tokens``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SOURCE_STATS = ("source_loss", "source_tokens")
"""The step's per-source metrics (arrays over the sources, each divided by the step's ``num_tokens``)."""


def host_metrics(metrics: Mapping[str, Any], source_names: Sequence[str]) -> dict[str, float]:
    """A step's fetched metrics as numbers, the per-source arrays spelt out by source name.

    Args:
        metrics: the train step's metrics on the host (scalars; with a mixture also `SOURCE_STATS`).
        source_names: the sources in `source_order`.

    Returns:
        Every scalar metric, and per source ``train/<name>/loss`` (the mean loss over that source's target
        tokens in the step; NaN when the step has none) and ``train/<name>/tokens`` (their count).
    """
    host = {name: float(np.asarray(value)) for name, value in metrics.items() if name not in SOURCE_STATS}
    if "source_loss" not in metrics:
        return host
    losses, shares = np.asarray(metrics["source_loss"]), np.asarray(metrics["source_tokens"])
    for index, name in enumerate(source_names):
        share = float(shares[index])
        host[f"train/{name}/loss"] = float(losses[index]) / share if share > 0 else math.nan
        host[f"train/{name}/tokens"] = float(round(share * host["num_tokens"]))
    return host
