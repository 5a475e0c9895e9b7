"""The tracker protocol: where metrics go (a file, TensorBoard, wandb, several at once)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

Metrics = Mapping[str, Any]
"""Metric name -> value. Values are Python or numpy/jax scalars; names use `/` for grouping (`train/loss`)."""


@runtime_checkable
class Tracker(Protocol):
    """Receives metrics during a run. Implementations are cheap to call every step."""

    def log(self, metrics: Metrics, step: int) -> None:
        """Record `metrics` as the values at optimizer step `step`."""
        ...

    def log_summary(self, metrics: Metrics) -> None:
        """Record end-of-run values (goodput, final loss, ...) that belong to no step."""
        ...

    def finish(self) -> None:
        """Flush and close; the tracker is not used afterwards."""
        ...


HISTOGRAMS_METHOD = "log_histograms"
"""A tracker that draws histograms also has ``log_histograms(histograms, step)``, ``histograms`` mapping a name
to ``(counts [bins], bin edges [bins + 1])`` numpy arrays (TensorBoard, wandb; `MultiTracker` forwards to
those that have it)."""


def scalar_metrics(metrics: Metrics) -> dict[str, float | int]:
    """Convert metric values to Python numbers (jax/numpy scalars and 0-d or 1-element arrays included).

    Args:
        metrics: name -> value.

    Raises:
        ValueError: a value that is not a single number, naming its key.
    """
    converted: dict[str, float | int] = {}
    for key, value in metrics.items():
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            array = np.asarray(None)
        if array.size != 1 or array.dtype.kind not in "biuf":
            raise ValueError(
                f"metric '{key}' must be a single number, got {type(value).__name__} {value!r:.80}."
            )
        item = array.reshape(()).item()
        converted[key] = int(item) if array.dtype.kind in "biu" else float(item)
    return converted


def json_number(value: float | int) -> float | int | str:
    """A JSON-safe number: NaN and infinities become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
