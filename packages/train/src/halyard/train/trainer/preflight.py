"""Every check that needs only the config, run before any data is tokenized or any array is allocated.

A run that cannot start should say so in a second, not after an hour of building its token cache: the
schedule against the steps, the batch against the hosts and the batch mesh axes (the accumulation is
checked by the config itself), the tokenizer (it exists, loads, and fits the model's vocabulary), the
model's shapes and their layout on the mesh (traced with shapes only), the checkpoint policies, the
harness tasks (lm-eval installed, the names known), and the checkpoint that ``trainer.init`` names.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from halyard.data import DataInputError
from halyard.shard import batch_share, default_batch_axes, mesh_axis_sizes
from halyard.train.checkpoint.discovery import latest_complete, resolve_checkpoint
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.data_section import check_data_section, hf_tokenizer_folder
from halyard.train.data_assembly.datasets import PreparedData
from halyard.train.data_assembly.tokenizer import load_run_tokenizer
from halyard.train.lora.base import check_lora
from halyard.train.run.canonical import canonical_slices
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.harness_eval import check_harness
from halyard.train.trainer.parallelism_checks import check_context_parallel, check_pipeline
from halyard.train.user_errors import as_config_error, one_line


def check_before_data(setup: RunSetup) -> None:
    """Run the checks of this module for the run ``setup`` derives from its config (its mesh, layout and
    model config are built; the schedule, the optimizer and the abstract state are built here, once).

    Raises:
        ConfigError: naming the key and the fix, for the first check that fails.
    """
    check_shapes(setup)
    _check_tokenizer(setup.config, setup.model_config)
    check_harness(setup.config)


def check_shapes(setup: RunSetup) -> None:
    """The checks that read nothing but the config (what `halyard plan` runs too): the sequence length, the
    schedule, the batch on the mesh, LoRA's targets, the checkpoint policies, the optimizer and the model's
    layout on the mesh (traced with shapes only).

    Raises:
        ConfigError: naming the key and the fix, for the first check that fails.
    """
    config = setup.config
    _check_sequence_length(config, setup.model_config)
    check_context_parallel(config, setup.model_config, setup.mesh, setup.layout)
    check_pipeline(config, setup.model_config, setup.mesh, setup.layout)
    _check_schedule(setup)
    check_batch(config, setup.mesh, setup.layout)
    canonical_slices(config, setup.mesh)  # trainer.invariant: the optimizer, the mesh axes, the slices
    check_lora(config, setup.model_config)
    _check_watch(config, setup.mesh)
    checkpoint = config.checkpoint
    as_config_error("checkpoint", lambda: SavePolicy(checkpoint.every_steps, checkpoint.every_seconds))
    as_config_error("checkpoint", lambda: KeepPolicy(checkpoint.keep_last, checkpoint.keep_every_steps))
    setup.optimizer  # noqa: B018  (built now: a bad optimizer setting fails before any data is read)
    sizes = {axis: size for axis, size in mesh_axis_sizes(setup.mesh).items() if size > 1}
    as_config_error(
        f"model on trainer.layout={config.trainer.layout} and trainer.mesh {sizes}",
        lambda: setup.abstract_state,
    )


def _check_watch(config: TrainConfig, mesh: Any) -> None:
    """``trainer.watch.model`` where the step can carry the model's reports out: not through the invariant
    step's summed slices nor through the pipeline's stages (norms and histograms work everywhere)."""
    watch = config.trainer.watch
    if not (watch.enabled and watch.model):
        return
    if config.trainer.invariant:
        raise ConfigError(
            "trainer.watch.model needs trainer.invariant false: the invariant step adds its slices' outputs "
            "up, which a maximum does not survive; set trainer.watch.model false to watch the norms only"
        )
    if mesh_axis_sizes(mesh).get("stage", 1) > 1:
        raise ConfigError(
            "trainer.watch.model does not reach inside a pipeline (trainer.mesh.stage > 1) yet; set "
            "trainer.watch.model false to watch the norms only"
        )


def check_model_fits_data(model_config: Any, data: PreparedData) -> None:
    """Check that the cache's tokenizer fits the model's vocabulary.

    Raises:
        ValueError: ``model.vocab_size`` is smaller than the tokenizer's vocabulary.
    """
    vocab = int(data.cache.processor_metadata.get("vocab_size", 0))
    if vocab > model_config.vocab_size:
        raise ValueError(
            f"model.vocab_size={model_config.vocab_size} is smaller than the tokenizer's vocabulary ({vocab} "
            f"tokens in {data.tokenizer_path}); set model.vocab_size >= {vocab}"
        )


def finished_step(config: TrainConfig) -> int | None:
    """The step of the run folder's latest checkpoint when it is at ``trainer.steps`` or beyond (the run has
    nothing left to train), else None."""
    checkpoints = Path(config.trainer.run_dir) / "checkpoints"
    if config.trainer.init == "scratch" or not checkpoints.is_dir():
        return None
    latest = latest_complete(checkpoints)
    return latest if latest is not None and latest >= config.trainer.steps else None


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
    if config.trainer.objective == "grpo":  # its sequences are prompt + rl.max_new_tokens, checked with them
        return
    if max_position is not None and config.data.seq_len > max_position:
        raise ConfigError(
            f"data.seq_len={config.data.seq_len} exceeds model.max_position={max_position}; shorten "
            "data.seq_len or raise model.max_position"
        )


def _check_schedule(setup: RunSetup) -> None:
    config, steps = setup.config, setup.schedule_steps
    schedule = getattr(config.optimizer, "schedule", None)
    if schedule is not None:
        warmup = as_config_error("optimizer.schedule.warmup", lambda: schedule.warmup_steps(steps))
        if warmup > steps:
            raise ConfigError(
                f"optimizer.schedule.warmup={schedule.warmup:g} is {warmup} steps, more than trainer.steps="
                f"{config.trainer.steps}; lower the warmup (a value below 1 is a fraction of the run) or "
                "raise trainer.steps"
            )
    setup.schedule  # noqa: B018  (built now, once: a bad schedule names optimizer.schedule)


def check_batch(config: TrainConfig, mesh: Any, layout: Any) -> None:
    """Check that ``trainer.batch_size`` splits over the processes and over the batch mesh axes of the layout.

    Raises:
        ConfigError: naming ``trainer.batch_size`` and the multiple to use.
    """
    cfg = config.trainer
    hosts = batch_share(mesh, layout)[1]  # the processes that load different rows
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
    if config.trainer.objective == "grpo":  # prompt records: no token cache (halyard.train.rl.session)
        if config.data.builtin_corpus is not None or not config.data.sources:
            return  # a built-in prompt corpus brings its tokenizer; no sources is named when the prompts load
        path: str | None = config.data.tokenizer or hf_tokenizer_folder(config.trainer.init)
        if path is None:
            raise ConfigError(
                "data.tokenizer is not set: give a tokenizer.json or folder (or trainer.init: hf:FOLDER)"
            )
    else:
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
