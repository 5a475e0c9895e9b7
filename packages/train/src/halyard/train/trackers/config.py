"""Tracker configs, chosen by `type:` (jsonl | tensorboard | wandb); a run may list several.

trackers:
  - {type: jsonl}
  - {type: tensorboard}
  - {type: wandb, project: my-project, mode: offline}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halyard.train.config.choices import choice_section, register
from halyard.train.trackers.base import Tracker
from halyard.train.trackers.jsonl import JsonlTracker
from halyard.train.trackers.multi import MultiTracker
from halyard.train.trackers.tensorboard import TensorBoardTracker
from halyard.train.trackers.wandb_tracker import WandbTracker


@choice_section
@dataclass(frozen=True)
class TrackerConfig:
    """Where metrics go (`type:` selects the tracker)."""

    def build(
        self,
        run_dir: str | os.PathLike[str],
        *,
        hyperparameters: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> Tracker:
        """Create the tracker for a run.

        Args:
            run_dir: the training run's directory (files go inside it).
            hyperparameters: the flattened run config (`flatten_config`), stored where the tracker can.
            resume_step: the step a resumed run continues from (None for a fresh run).
        """
        raise TypeError(f"{type(self).__name__} is the base class; pick a tracker with `type:`.")


@register(TrackerConfig, "jsonl")
@dataclass(frozen=True)
class JsonlTrackerConfig(TrackerConfig):
    """One JSON line per logged step, in the run directory."""

    filename: str = "metrics.jsonl"
    """File name inside the run directory."""

    def build(self, run_dir, *, hyperparameters=None, resume_step=None) -> Tracker:
        return JsonlTracker(Path(run_dir) / self.filename, resume_step=resume_step)


@register(TrackerConfig, "tensorboard")
@dataclass(frozen=True)
class TensorBoardTrackerConfig(TrackerConfig):
    """TensorBoard event files (tensorboardX), in a folder of the run directory."""

    subdir: str = "tensorboard"
    """Folder inside the run directory (point `tensorboard --logdir` at it)."""

    def build(self, run_dir, *, hyperparameters=None, resume_step=None) -> Tracker:
        return TensorBoardTracker(Path(run_dir) / self.subdir, hyperparameters=hyperparameters)


@register(TrackerConfig, "wandb")
@dataclass(frozen=True)
class WandbTrackerConfig(TrackerConfig):
    """Weights & Biases; the run id is kept in the run directory so a resumed run continues it."""

    project: str = "halyard"
    """wandb project."""
    entity: str | None = None
    """wandb team or user (null: the account's default)."""
    name: str | None = None
    """Display name of the run (null: chosen by wandb)."""
    mode: str = "offline"
    """online | offline (no network; upload later with `wandb sync`) | disabled."""
    tags: tuple[str, ...] = ()
    """Labels for the run."""

    def build(self, run_dir, *, hyperparameters=None, resume_step=None) -> Tracker:
        return WandbTracker(
            run_dir,
            project=self.project,
            entity=self.entity,
            name=self.name,
            mode=self.mode,
            tags=self.tags,
            hyperparameters=hyperparameters,
        )


def build_trackers(
    configs: Sequence[TrackerConfig],
    run_dir: str | os.PathLike[str],
    *,
    hyperparameters: Mapping[str, Any] | None = None,
    resume_step: int | None = None,
) -> MultiTracker:
    """Build every configured tracker into one `MultiTracker` (see `TrackerConfig.build` for the arguments)."""
    return MultiTracker(
        [
            config.build(run_dir, hyperparameters=hyperparameters, resume_step=resume_step)
            for config in configs
        ]
    )
