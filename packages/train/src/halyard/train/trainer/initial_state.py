"""The state a run starts from: its own latest checkpoint, else what ``trainer.init`` names (a checkpoint,
a checkpoint's weights, a Hugging Face folder) or a fresh initialisation, created in its sharded layout."""

from __future__ import annotations

from typing import Any

import jax

from halyard.shard import is_main_process
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.data_position import DataMismatchError
from halyard.train.checkpoint.discovery import resolve_checkpoint
from halyard.train.checkpoint.layout import step_directory
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.config.errors import ConfigError
from halyard.train.mixture.resume import resume_data_position
from halyard.train.run.mesh_record import mesh_record, resume_note
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import hf_model
from halyard.train.step import TrainState, init_state
from halyard.train.trainer.preflight import check_init_source
from halyard.train.user_errors import one_line


def initial_state(setup: RunSetup, manager: CheckpointManager, data_position: dict[str, Any]) -> TrainState:
    """The run's first state, placed in the shardings of ``setup.abstract_state``.

    A run with checkpoints of its own resumes the latest (every mode but scratch, which refuses): the init
    source only seeds the first start, so the same command continues a preempted run.

    Raises:
        ConfigError: see `check_init_source`; or the run's own checkpoint was written for other data.
    """
    config = setup.config
    init = config.trainer.init
    abstract, shardings = setup.abstract_state
    check_init_source(config, manager.directory)
    if manager.latest_step() is not None:
        try:
            expected = resume_data_position(config, manager, data_position)  # a mixture's weights changed?
            state = manager.restore(None, abstract, shardings, expected_data=expected).state
            _say_whether_the_mesh_change_is_bitwise(setup, manager, int(state.step))
            return state
        except DataMismatchError as error:
            raise ConfigError(
                f"{one_line(error.differences)} In the run config: give the original data, trainer.batch_size and "
                "trainer.seed, "
                f"or start a new trainer.run_dir with trainer.init=checkpoint:{manager.directory} to "
                "continue on other data"
            ) from error
    if init.startswith("checkpoint:"):
        path = resolve_checkpoint(init.removeprefix("checkpoint:"))
        return manager.restore(
            path, abstract, shardings, expected_data=data_position, allow_data_mismatch=True
        ).state
    key = jax.random.PRNGKey(config.trainer.seed)
    if config.lora.enabled:  # fresh adapters; trainer.init names the frozen base (halyard.train.run.sources)
        return jax.jit(setup.init_state, out_shardings=shardings)(key)
    if init.startswith("hf:"):
        model = hf_model(config, setup.layout, setup.mesh)
        return jax.jit(lambda m: init_state(m, setup.optimizer, key), out_shardings=shardings)(model)
    state = jax.jit(setup.init_state, out_shardings=shardings)(key)
    if init.startswith("weights:"):
        path = resolve_checkpoint(init.removeprefix("weights:"))
        params = manager.restore_weights(path, abstract.params, shardings.params, params_path="params")
        return _replace_params(state, params)
    return state


def _say_whether_the_mesh_change_is_bitwise(setup: RunSetup, manager: CheckpointManager, step: int) -> None:
    """One line when the run resumes on another mesh or process count: whether it stays bitwise."""
    saved = read_commit_marker(step_directory(manager.directory, step)).extra_metadata
    note = resume_note(saved, mesh_record(setup.config, setup.mesh))
    if note is not None and is_main_process():
        print(note, flush=True)


def _replace_params(state: TrainState, params: Any) -> TrainState:
    return TrainState(
        step=state.step,
        params=params,
        opt_state=state.opt_state,
        key=state.key,
        nonfinite_steps=state.nonfinite_steps,
    )
