"""Sending metrics to several trackers at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from halyard.train.trackers.base import Metrics, Tracker


class MultiTracker:
    """Forwards every call to each of its trackers, in order."""

    def __init__(self, trackers: Sequence[Tracker]):
        """Args:
        trackers: the trackers to forward to (may be empty: then nothing is recorded).
        """
        self.trackers = tuple(trackers)

    def log(self, metrics: Metrics, step: int) -> None:
        """Log `metrics` at `step` to every tracker."""
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_histograms(self, histograms: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int) -> None:
        """Log histograms at `step` to every tracker that draws them (one with a ``log_histograms`` method)."""
        for tracker in self.trackers:
            log = getattr(tracker, "log_histograms", None)
            if log is not None:
                log(histograms, step)

    def log_summary(self, metrics: Metrics) -> None:
        """Record the summary in every tracker."""
        for tracker in self.trackers:
            tracker.log_summary(metrics)

    def finish(self) -> None:
        """Finish every tracker, even if one of them fails (the first error is raised afterwards)."""
        errors = []
        for tracker in self.trackers:
            try:
                tracker.finish()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]
