"""halyard.train: train a model from a config, and load what a run trained.

    from halyard.train import Trainer, TrainConfig, parse_config

    config = parse_config(TrainConfig, ["--config", "demo.yaml", "--trainer.steps", "50"])
    result = Trainer(config).fit()                 # resumes when the run folder holds a checkpoint
    loaded = load_run_model(config.trainer.run_dir)   # weights only, on the run's mesh: no optimizer

These names are the package's public surface (tests/public_api.json); the modules below hold the
implementation and may change between minor versions. A name is imported on first use, so
``import halyard.train.optim`` does not import the trainer.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from halyard.train.builtin_configs import builtin_configs, resolve_config_paths
    from halyard.train.config.errors import ConfigError
    from halyard.train.config.parse import parse_config
    from halyard.train.corpora.tokenizer import train_bpe_tokenizer
    from halyard.train.eval_config import EvalConfig
    from halyard.train.objectives.config import DpoConfig
    from halyard.train.optim.config import AdamWConfig, LionConfig, MuonConfig, OptimizerConfig, SophiaHConfig
    from halyard.train.optim.schedule_config import (
        ConstantScheduleConfig,
        CosineScheduleConfig,
        LinearScheduleConfig,
        WSDScheduleConfig,
    )
    from halyard.train.run.loading import LoadedModel, load_hf_model, load_run_config, load_run_model
    from halyard.train.run.setup import RunSetup
    from halyard.train.run_config import CheckpointConfig, DataConfig, TrainConfig, TrainerConfig
    from halyard.train.step import TrainState
    from halyard.train.trackers.config import JsonlTrackerConfig, TensorBoardTrackerConfig, WandbTrackerConfig
    from halyard.train.trackers.jsonl import read_jsonl
    from halyard.train.trainer.trainer import FitResult, NonFiniteLossError, Trainer

_WHERE = {
    "Trainer": "halyard.train.trainer.trainer",
    "FitResult": "halyard.train.trainer.trainer",
    "NonFiniteLossError": "halyard.train.trainer.trainer",
    "RunSetup": "halyard.train.run.setup",
    "TrainState": "halyard.train.step",
    "LoadedModel": "halyard.train.run.loading",
    "load_run_config": "halyard.train.run.loading",
    "load_run_model": "halyard.train.run.loading",
    "load_hf_model": "halyard.train.run.loading",
    "TrainConfig": "halyard.train.run_config",
    "DataConfig": "halyard.train.run_config",
    "TrainerConfig": "halyard.train.run_config",
    "CheckpointConfig": "halyard.train.run_config",
    "EvalConfig": "halyard.train.eval_config",
    "DpoConfig": "halyard.train.objectives.config",
    "ConfigError": "halyard.train.config.errors",
    "parse_config": "halyard.train.config.parse",
    "OptimizerConfig": "halyard.train.optim.config",
    "AdamWConfig": "halyard.train.optim.config",
    "LionConfig": "halyard.train.optim.config",
    "SophiaHConfig": "halyard.train.optim.config",
    "MuonConfig": "halyard.train.optim.config",
    "ConstantScheduleConfig": "halyard.train.optim.schedule_config",
    "CosineScheduleConfig": "halyard.train.optim.schedule_config",
    "LinearScheduleConfig": "halyard.train.optim.schedule_config",
    "WSDScheduleConfig": "halyard.train.optim.schedule_config",
    "JsonlTrackerConfig": "halyard.train.trackers.config",
    "TensorBoardTrackerConfig": "halyard.train.trackers.config",
    "WandbTrackerConfig": "halyard.train.trackers.config",
    "builtin_configs": "halyard.train.builtin_configs",
    "resolve_config_paths": "halyard.train.builtin_configs",
    "read_jsonl": "halyard.train.trackers.jsonl",
    "train_bpe_tokenizer": "halyard.train.corpora.tokenizer",
}
"""Public name -> the module that defines it."""

__all__ = [
    "AdamWConfig",
    "CheckpointConfig",
    "ConfigError",
    "ConstantScheduleConfig",
    "CosineScheduleConfig",
    "DataConfig",
    "DpoConfig",
    "EvalConfig",
    "FitResult",
    "JsonlTrackerConfig",
    "LinearScheduleConfig",
    "LionConfig",
    "LoadedModel",
    "MuonConfig",
    "NonFiniteLossError",
    "OptimizerConfig",
    "RunSetup",
    "SophiaHConfig",
    "TensorBoardTrackerConfig",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "WSDScheduleConfig",
    "WandbTrackerConfig",
    "builtin_configs",
    "load_hf_model",
    "load_run_config",
    "load_run_model",
    "parse_config",
    "read_jsonl",
    "resolve_config_paths",
    "train_bpe_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'halyard.train' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
