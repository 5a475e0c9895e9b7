"""Tracker sections in a config: a list of `type:` choices, checked like every other key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from halyard.train.config.errors import ConfigError
from halyard.train.config.flatten import flatten_config
from halyard.train.config.parse import parse_config
from halyard.train.trackers.config import JsonlTrackerConfig, TrackerConfig, WandbTrackerConfig


@dataclass(frozen=True)
class RunConfig:
    trackers: tuple[TrackerConfig, ...] = (JsonlTrackerConfig(),)
    """Where metrics go."""


def test_tracker_list_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trackers:\n  - type: jsonl\n  - type: wandb\n    project: demo\n    tags: [a, b]\n")
    config = parse_config(RunConfig, [], path)
    assert config.trackers == (JsonlTrackerConfig(), WandbTrackerConfig(project="demo", tags=("a", "b")))


def test_unknown_tracker_key_and_type_are_named():
    with pytest.raises(ConfigError, match=r"'trackers\.0\.projct'.*Did you mean 'trackers\.0\.project'"):
        parse_config(RunConfig, ["--trackers", "[{type: wandb, projct: x}]"])
    with pytest.raises(ConfigError, match="Did you mean 'tensorboard'"):
        parse_config(RunConfig, ["--trackers", "[{type: tensorbord}]"])


def test_flatten_config_gives_dotted_hyperparameters():
    flat = flatten_config(RunConfig(trackers=(WandbTrackerConfig(project="p"),)))
    assert flat == {
        "trackers": [
            {"type": "wandb", "project": "p", "entity": None, "name": None, "mode": "offline", "tags": []}
        ]
    }
