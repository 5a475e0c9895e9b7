"""A tracker writing TensorBoard event files with tensorboardX."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from halyard.train.trackers.base import Metrics, scalar_metrics


class TensorBoardTracker:
    """Writes each metric as a scalar series, the summary as text, hyperparameters as text too."""

    def __init__(self, log_dir: str | os.PathLike[str], hyperparameters: Mapping[str, Any] | None = None):
        """Open an event file in `log_dir`.

        Args:
            log_dir: directory for the event files (created if missing); point `tensorboard --logdir` at it.
            hyperparameters: the run's configuration, stored once as text under `hyperparameters`.
        """
        from tensorboardX import SummaryWriter  # imports torch: only for runs that use TensorBoard

        self.log_dir = os.fspath(log_dir)
        self._writer = SummaryWriter(logdir=self.log_dir, flush_secs=10)
        if hyperparameters:
            text = "\n".join(f"    {key}: {value}" for key, value in sorted(hyperparameters.items()))
            self._writer.add_text("hyperparameters", text, global_step=0)

    def log(self, metrics: Metrics, step: int) -> None:
        """Add one scalar per metric at `step`."""
        for key, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=int(step))

    def log_histograms(self, histograms: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int) -> None:
        """Add each ``name: (counts, edges)`` as a TensorBoard histogram at `step` (bucket limits: the upper edges)."""
        for name, (counts, edges) in histograms.items():
            counts, edges = np.asarray(counts, np.float64), np.asarray(edges, np.float64)
            centres = (edges[:-1] + edges[1:]) / 2
            self._writer.add_histogram_raw(
                name,
                min=float(edges[0]),
                max=float(edges[-1]),
                num=float(counts.sum()),
                sum=float((counts * centres).sum()),
                sum_squares=float((counts * centres**2).sum()),
                bucket_limits=edges[1:].tolist(),
                bucket_counts=counts.tolist(),
                global_step=int(step),
            )

    def log_summary(self, metrics: Metrics) -> None:
        """Add each summary value as text under `summary/<name>`."""
        for key, value in metrics.items():
            self._writer.add_text(f"summary/{key}", str(value), global_step=0)

    def finish(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
