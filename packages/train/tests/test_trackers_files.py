"""Trackers write files that read back: JSONL lines, TensorBoard events, offline wandb runs (resumed too)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from tracker_files import read_tensorboard_scalars, read_when_flushed

from halyard.train.trackers.base import Tracker
from halyard.train.trackers.config import (
    JsonlTrackerConfig,
    TensorBoardTrackerConfig,
    WandbTrackerConfig,
    build_trackers,
)
from halyard.train.trackers.jsonl import JsonlTracker, read_jsonl
from halyard.train.trackers.multi import MultiTracker
from halyard.train.trackers.tensorboard import TensorBoardTracker
from halyard.train.trackers.wandb_offline import offline_run_files
from halyard.train.trackers.wandb_tracker import RUN_ID_FILE


def test_jsonl_one_line_per_step_with_numbers_from_any_source(tmp_path):
    tracker = JsonlTracker(tmp_path / "run" / "metrics.jsonl")
    tracker.log({"train/loss": jnp.float32(2.5), "tokens": np.int64(512), "lr": 1e-3}, step=1)
    tracker.log({"train/loss": float("nan"), "grad_norm": jnp.array([math.inf])}, step=2)
    tracker.log_summary({"final_loss": 1.25, "device": "cpu"})
    tracker.finish()
    lines = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert lines == [
        {"step": 1, "train/loss": 2.5, "tokens": 512, "lr": 1e-3},
        {"step": 2, "train/loss": "NaN", "grad_norm": "Infinity"},
    ]
    summary = (tmp_path / "run" / "metrics.summary.json").read_text()
    assert '"final_loss": 1.25' in summary
    assert '"device": "cpu"' in summary


def test_jsonl_resume_drops_steps_after_the_checkpoint_and_ignores_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = JsonlTracker(path)
    for step in range(1, 6):
        first.log({"loss": float(step)}, step=step)
    first.finish()
    with open(path, "a") as stream:
        stream.write('{"step": 6, "lo')  # killed mid-write
    resumed = JsonlTracker(path, resume_step=4)
    resumed.log({"loss": 40.0}, step=4)
    resumed.finish()
    assert [(line["step"], line["loss"]) for line in read_jsonl(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_non_scalar_metric_is_named(tmp_path):
    tracker = JsonlTracker(tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="metric 'logits' must be a single number"):
        tracker.log({"logits": np.ones(3)}, step=0)
    tracker.finish()


def test_tensorboard_scalars_read_back(tmp_path):
    tracker = TensorBoardTracker(tmp_path / "tb", hyperparameters={"optimizer.type": "adamw"})
    for step in range(3):
        tracker.log({"train/loss": 3.0 - step, "train/lr": jnp.float32(0.5)}, step=step)
    tracker.log_summary({"final": 1})
    tracker.finish()
    scalars = read_tensorboard_scalars(tmp_path / "tb")
    assert scalars["train/loss"] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert scalars["train/lr"] == [(0, 0.5), (1, 0.5), (2, 0.5)]


class Recorder:
    def __init__(self, fail_on_finish: bool = False):
        self.calls: list[tuple] = []
        self.fail_on_finish = fail_on_finish

    def log(self, metrics, step):
        self.calls.append(("log", dict(metrics), step))

    def log_summary(self, metrics):
        self.calls.append(("summary", dict(metrics)))

    def finish(self):
        self.calls.append(("finish",))
        if self.fail_on_finish:
            raise RuntimeError("disk full")


def test_multi_tracker_forwards_everything_and_finishes_all_even_after_an_error():
    failing, healthy = Recorder(fail_on_finish=True), Recorder()
    assert isinstance(failing, Tracker)
    multi = MultiTracker([failing, healthy])
    multi.log({"a": 1}, step=3)
    multi.log_summary({"b": 2})
    with pytest.raises(RuntimeError, match="disk full"):
        multi.finish()
    assert failing.calls == healthy.calls == [("log", {"a": 1}, 3), ("summary", {"b": 2}), ("finish",)]


def test_wandb_offline_run_is_written_and_a_resume_continues_the_same_run(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    config = WandbTrackerConfig(project="test", mode="offline")
    first = config.build(run_dir, hyperparameters={"trainer.steps": 4})
    first.log({"train/loss": 2.0}, step=1)
    first.log({"train/loss": 1.5}, step=2)
    first.finish()
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()

    resumed = config.build(run_dir)
    resumed.log({"train/loss": 1.0}, step=3)
    resumed.log_summary({"goodput": 0.9})
    resumed.finish()

    files = offline_run_files(run_dir)
    assert len(files) == 2
    assert all(path.name == f"run-{run_id}.wandb" for path in files)
    before, after = (read_when_flushed(path) for path in files)
    assert before["run_id"] == after["run_id"] == run_id
    assert [(row["_step"], row["train/loss"]) for row in before["history"]] == [(1, 2.0), (2, 1.5)]
    assert [(row["_step"], row["train/loss"]) for row in after["history"]] == [(3, 1.0)]
    assert after["summary"]["goodput"] == 0.9


def test_build_trackers_from_configs_writes_every_sink(tmp_path):
    tracker = build_trackers(
        [JsonlTrackerConfig(filename="m.jsonl"), TensorBoardTrackerConfig(subdir="tb")], tmp_path
    )
    tracker.log({"loss": 1.0}, step=7)
    tracker.finish()
    assert read_jsonl(tmp_path / "m.jsonl") == [{"step": 7, "loss": 1.0}]
    assert read_tensorboard_scalars(tmp_path / "tb") == {"loss": [(7, 1.0)]}


def test_wandb_mode_is_checked(tmp_path, offline_wandb):
    with pytest.raises(ValueError, match="wandb mode must be one of"):
        WandbTrackerConfig(mode="offlne").build(tmp_path)
