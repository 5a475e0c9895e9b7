"""A tracker logging to Weights & Biases; offline by default, and a resumed run continues the same run.

The wandb run id is kept in `<run_dir>/wandb_run_id`: a run restarted in the same run directory reads it
and resumes that wandb run (`resume="allow"`), so its curves continue instead of starting a new run.
Offline runs are written under `<run_dir>/wandb/` and can be uploaded later with `wandb sync`.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from halyard.train.trackers.base import Metrics, scalar_metrics

RUN_ID_FILE = "wandb_run_id"
WANDB_MODES = ("online", "offline", "disabled")


class WandbTracker:
    """Logs metrics to a wandb run whose id survives restarts of the training run."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str = "halyard",
        entity: str | None = None,
        name: str | None = None,
        mode: str = "offline",
        tags: Sequence[str] = (),
        hyperparameters: Mapping[str, Any] | None = None,
    ):
        """Start (or resume) the wandb run of `run_dir`.

        Args:
            run_dir: the training run's directory; holds `wandb_run_id` and, offline, the `wandb/` folder.
            project: wandb project name.
            entity: wandb team or user (None: the account's default).
            name: display name of the run (None: wandb picks one).
            mode: `online`, `offline` (no network; sync later) or `disabled`.
            tags: labels for the run.
            hyperparameters: the run's configuration, shown as the wandb config.

        Raises:
            ValueError: an unknown `mode`.
        """
        import wandb  # deferred: importing wandb takes seconds and most commands never need it

        if mode not in WANDB_MODES:
            raise ValueError(f"wandb mode must be one of {', '.join(WANDB_MODES)}, got '{mode}'.")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        id_file = self.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None  # None: wandb picks one
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            id=run_id,
            resume="allow",
            dir=self.run_dir,
            mode=typing.cast(Any, mode),
            tags=list(tags),
            config=dict(hyperparameters or {}),
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        temporary = self.run_dir / f".{RUN_ID_FILE}.tmp"
        self.run_id: str = self.run.id
        temporary.write_text(self.run_id + "\n")
        os.replace(temporary, id_file)

    def log(self, metrics: Metrics, step: int) -> None:
        """Log `metrics` at `step` (wandb ignores steps not above the last one logged)."""
        self.run.log(scalar_metrics(metrics), step=int(step))

    def log_histograms(self, histograms: Mapping[str, tuple[np.ndarray, np.ndarray]], step: int) -> None:
        """Log each ``name: (counts, edges)`` as a ``wandb.Histogram`` at `step`."""
        import wandb

        self.run.log(
            {
                name: wandb.Histogram(np_histogram=(np.asarray(counts), np.asarray(edges)))
                for name, (counts, edges) in histograms.items()
            },
            step=int(step),
        )

    def log_summary(self, metrics: Metrics) -> None:
        """Set the run's summary values."""
        self.run.summary.update(dict(metrics))

    def finish(self) -> None:
        """Finish the wandb run (flushes the offline files)."""
        self.run.finish()
