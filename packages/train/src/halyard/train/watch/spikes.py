"""The loss-spike test: a z-score of each step's loss against the recent steps', and the run's spike log.

    test = SpikeTest(config.trainer.spikes)
    found = test.check(step, loss)     # None, or (zscore, mean, std) of a spike

A spike is left out of the recent steps, so one spike does not hide the next. The standard deviation has a
floor of 0.1% of the mean: a flat loss curve's noise is not a spike.
"""

from __future__ import annotations

import collections
import json
import math
import os
from pathlib import Path
from typing import Any

from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.watch.config import SpikeConfig

SPIKE_LOG = "spikes.jsonl"
"""The run folder's file of spikes, one JSON line each (step, loss, z-score, data position, worst examples)."""

RELATIVE_STD_FLOOR = 1e-3


class SpikeTest:
    """A rolling z-score test of the loss over the last ``config.window`` steps that were not spikes.

    Args:
        config: the ``trainer.spikes`` section.
    """

    def __init__(self, config: SpikeConfig) -> None:
        self.config = config
        self.recent: collections.deque[float] = collections.deque(maxlen=config.window)

    def check(self, step: int, loss: float) -> tuple[float, float, float] | None:
        """Test ``loss`` (of ``step``) against the recent steps, then remember it unless it is a spike.

        Returns:
            ``(zscore, mean, std)`` when the loss is a spike, else None (also before ``min_steps`` steps and
            for a non-finite loss, which the non-finite policy handles).
        """
        if not self.config.enabled or not math.isfinite(loss):
            return None
        if len(self.recent) >= self.config.min_steps:
            mean = math.fsum(self.recent) / len(self.recent)
            variance = math.fsum((value - mean) ** 2 for value in self.recent) / len(self.recent)
            std = max(math.sqrt(variance), RELATIVE_STD_FLOOR * abs(mean), 1e-12)
            zscore = (loss - mean) / std
            if zscore > self.config.zscore:
                return zscore, mean, std
        self.recent.append(loss)
        return None


class SpikeLog:
    """Appends spike records to ``<run_dir>/spikes.jsonl``; a resumed run drops the records at or after the
    step it resumes from (the interrupted run's, which it is about to find again).

    Args:
        path: the spike file.
        resume_step: the first step this process logs (None: keep every line).
    """

    def __init__(self, path: str | os.PathLike[str], resume_step: int | None = None) -> None:
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            kept = [line for line in read_jsonl(self.path) if line.get("step", -1) < resume_step]
            temporary = self.path.with_name(f".{self.path.name}.tmp")
            temporary.write_text("".join(json.dumps(line) + "\n" for line in kept))
            os.replace(temporary, self.path)

    def write(self, record: dict[str, Any]) -> None:
        """Append one spike's record."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")


def read_spikes(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The spike records of a run folder, oldest first (none when it has no spike file)."""
    path = Path(run_dir) / SPIKE_LOG
    return read_jsonl(path) if path.exists() else []
