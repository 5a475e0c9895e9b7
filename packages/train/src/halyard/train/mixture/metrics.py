"""A mixture's per-source figures under their names: ``train/<source>/loss`` and ``train/<source>/tokens``, and a
DoReMi proxy's ``doremi/<source>/weight`` and ``doremi/<source>/excess_loss``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SOURCE_STATS = ("source_loss", "source_tokens")
"""The step's per-source metrics (arrays over the sources, each divided by the step's ``num_tokens``)."""
DOMAIN_NAMES = {"domain_weights": "weight", "excess_loss": "excess_loss"}
"""A DoReMi proxy step's per-source metrics (`halyard.train.step.PLAIN_STATS`) -> their names under ``doremi/<source>/``."""


def host_metrics(metrics: Mapping[str, Any], source_names: Sequence[str]) -> dict[str, float]:
    """A step's fetched metrics as numbers, the per-source arrays spelt out by source name.

    Args:
        metrics: the train step's metrics on the host (scalars; with a mixture also `SOURCE_STATS`).
        source_names: the sources in `source_order`.

    Returns:
        Every scalar metric, and per source ``train/<name>/loss`` (the mean loss over that source's target
        tokens in the step; NaN when the step has none) and ``train/<name>/tokens`` (their count); for a DoReMi
        proxy ``doremi/<name>/weight`` (the step's domain weight) and ``doremi/<name>/excess_loss``.
    """
    per_source = (*SOURCE_STATS, *DOMAIN_NAMES)
    host = {name: float(np.asarray(value)) for name, value in metrics.items() if name not in per_source}
    for stat, short in DOMAIN_NAMES.items():
        if stat in metrics:
            values = np.asarray(metrics[stat])
            host.update({f"doremi/{name}/{short}": float(values[i]) for i, name in enumerate(source_names)})
    if "source_loss" not in metrics:
        return host
    losses, shares = np.asarray(metrics["source_loss"]), np.asarray(metrics["source_tokens"])
    for index, name in enumerate(source_names):
        share = float(shares[index])
        host[f"train/{name}/loss"] = float(losses[index]) / share if share > 0 else math.nan
        host[f"train/{name}/tokens"] = float(round(share * host["num_tokens"]))
    return host
