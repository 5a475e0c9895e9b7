"""Trackers: a tiny protocol (`log(metrics, step)`, `log_summary(metrics)`, `finish()`) and its sinks.

tracker = build_trackers([JsonlTrackerConfig(), WandbTrackerConfig()], run_dir,
                         hyperparameters=flatten_config(config), resume_step=None)
tracker.log({"train/loss": 2.3, "train/learning_rate": 1e-3}, step=10)
tracker.log_summary({"goodput/step_fraction": 0.93})
tracker.finish()
"""

from halyard.train.trackers.base import Metrics, Tracker, scalar_metrics
from halyard.train.trackers.config import (
    JsonlTrackerConfig,
    TensorBoardTrackerConfig,
    TrackerConfig,
    WandbTrackerConfig,
    build_trackers,
)
from halyard.train.trackers.jsonl import JsonlTracker, read_jsonl
from halyard.train.trackers.multi import MultiTracker
from halyard.train.trackers.tensorboard import TensorBoardTracker
from halyard.train.trackers.wandb_offline import offline_run_files, read_offline_run
from halyard.train.trackers.wandb_tracker import RUN_ID_FILE, WandbTracker

__all__ = [
    "RUN_ID_FILE",
    "JsonlTracker",
    "JsonlTrackerConfig",
    "Metrics",
    "MultiTracker",
    "TensorBoardTracker",
    "TensorBoardTrackerConfig",
    "Tracker",
    "TrackerConfig",
    "WandbTracker",
    "WandbTrackerConfig",
    "build_trackers",
    "offline_run_files",
    "read_jsonl",
    "read_offline_run",
    "scalar_metrics",
]
