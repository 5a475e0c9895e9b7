"""Every check that needs only the config, run before any data is tokenized or any array is allocated.

A run that cannot start should say so in a second, not after an hour of building its token cache: the
schedule against the steps, the batch against the hosts and the batch mesh axes (the accumulation is
checked by the config itself), the tokenizer (it exists, loads, and fits the model's vocabulary), the
model's shapes and their layout on the mesh (traced with shapes only), the checkpoint policies, the
harness tasks (lm-eval installed, the names known), and the checkpoint that ``trainer.init`` names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from halyard.data import DataInputError
from halyard.shard import default_batch_axes, mesh_axis_sizes, process_count
from halyard.train.checkpoint import KeepPolicy, SavePolicy, latest_complete, resolve_checkpoint
from halyard.train.config import ConfigError
from halyard.train.lora.base import check_lora
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.data import check_data_section, load_run_tokenizer
from halyard.train.trainer.harness_eval import check_harness
from halyard.train.user_errors import one_line

if TYPE_CHECKING:
    from halyard.train.trainer.trainer import Trainer

T = TypeVar("T")


def as_config_error(key: str, build: Callable[[], T]) -> T:
    """``build()``, with a ``ValueError`` it raises turned into a `ConfigError` naming ``key``."""
    try:
        return build()
    except ValueError as error:
        raise ConfigError(f"{key}: {one_line(str(error))}") from error


def check_before_data(trainer: Trainer) -> None:
    """Run the checks of this module for ``trainer`` (its mesh, layout and model config are built).

    Raises:
        ConfigError: naming the key and the fix, for the first check that fails.
    """
    config = trainer.config
    _check_sequence_length(config, trainer.model_config)
    _check_schedule(config)
    _check_batch(config, trainer.mesh, trainer.layout)
    _check_tokenizer(config, trainer.model_config)
    check_lora(config, trainer.model_config)
    checkpoint = config.checkpoint
    as_config_error("checkpoint", lambda: SavePolicy(checkpoint.every_steps, checkpoint.every_seconds))
    as_config_error("checkpoint", lambda: KeepPolicy(checkpoint.keep_last, checkpoint.keep_every_steps))
    check_harness(config)
    optimizer = as_config_error("optimizer", trainer.build_optimizer)
    sizes = {axis: size for axis, size in mesh_axis_sizes(trainer.mesh).items() if size > 1}
    as_config_error(
        f"model on trainer.layout={config.trainer.layout} and trainer.mesh {sizes}",
        lambda: trainer.abstract_state(optimizer),
    )


def check_init_source(config: TrainConfig, checkpoints: Path) -> None:
    """Check that ``trainer.init`` can start: resume has a checkpoint, scratch has none, a named checkpoint
    exists and is complete.

    Args:
        config: the run config.
        checkpoints: this run's checkpoint folder.

    Raises:
        ConfigError: naming ``trainer.init`` and what to do.
    """
    init = config.trainer.init
    latest = latest_complete(checkpoints) if checkpoints.is_dir() else None
    if latest is not None and init == "scratch":
        raise ConfigError(
            f"{checkpoints} already holds checkpoint step {latest}; trainer.init=scratch would mix two runs "
            "in one directory. Use a new trainer.run_dir, or trainer.init=auto to resume"
        )
    if latest is None and init == "resume":
        raise ConfigError(
            f"trainer.init=resume but {checkpoints} holds no complete checkpoint; use trainer.init=auto "
            "to start when there is none"
        )
    if latest is None and init.startswith(("checkpoint:", "weights:")):
        try:
            resolve_checkpoint(init.split(":", 1)[1])  # a damaged one raises DamagedCheckpointError (exit 1)
        except FileNotFoundError as error:
            raise ConfigError(f"trainer.init={init}: {error}") from error


def _check_sequence_length(config: TrainConfig, model_config: Any) -> None:
    max_position = getattr(model_config, "max_position", None)
    if max_position is not None and config.data.seq_len > max_position:
        raise ConfigError(
            f"data.seq_len={config.data.seq_len} exceeds model.max_position={max_position}; shorten "
            "data.seq_len or raise model.max_position"
        )


def _check_schedule(config: TrainConfig) -> None:
    steps = max(config.trainer.steps, 1)
    schedule = getattr(config.optimizer, "schedule", None)
    if schedule is not None:
        warmup = as_config_error("optimizer.schedule.warmup", lambda: schedule.warmup_steps(steps))
        if warmup > steps:
            raise ConfigError(
                f"optimizer.schedule.warmup={schedule.warmup:g} is {warmup} steps, more than trainer.steps="
                f"{config.trainer.steps}; lower the warmup (a value below 1 is a fraction of the run) or "
                "raise trainer.steps"
            )
    as_config_error("optimizer.schedule", lambda: config.optimizer.learning_rate_schedule(steps))


def _check_batch(config: TrainConfig, mesh: Any, layout: Any) -> None:
    cfg = config.trainer
    hosts = process_count()
    if cfg.batch_size % hosts:
        raise ConfigError(
            f"trainer.batch_size={cfg.batch_size} does not split over the {hosts} processes of this run; "
            f"use a multiple of {hosts}"
        )
    axes = default_batch_axes(mesh, layout)
    sizes = mesh_axis_sizes(mesh)
    shards = math.prod(sizes[axis] for axis in axes)
    if cfg.batch_size % shards:
        spelled = " * ".join(f"{axis}={sizes[axis]}" for axis in axes)
        raise ConfigError(
            f"trainer.batch_size={cfg.batch_size} does not split over the {shards} devices of the batch mesh "
            f"axes ({spelled}) of trainer.layout={cfg.layout}; use a multiple of {shards} (or change "
            "trainer.mesh)"
        )


def _check_tokenizer(config: TrainConfig, model_config: Any) -> None:
    path = check_data_section(config.data, init=config.trainer.init)
    if path is None:  # trained on the builtin corpus when the data is prepared
        return
    key = (
        "data.tokenizer" if config.data.tokenizer else f"the tokenizer of trainer.init={config.trainer.init}"
    )
    try:
        vocab = load_run_tokenizer(path).get_vocab_size(with_added_tokens=True)
    except DataInputError as error:
        raise ConfigError(f"{key}: {one_line(str(error))}") from error
    if vocab > model_config.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model_config.vocab_size} is smaller than the vocabulary of {key} ({vocab} "
            f"tokens in {path}); set model.vocab_size >= {vocab}"
        )
