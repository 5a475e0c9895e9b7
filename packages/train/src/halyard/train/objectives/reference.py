"""DPO's reference model: the weights the run started from, frozen, and the hook adding its log-probabilities
to every batch before the train step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from halyard.shard import Layout
from halyard.train.checkpoint import CheckpointManager, resolve_checkpoint
from halyard.train.objectives.dpo import reference_logprobs
from halyard.train.trainer.initial_state import hf_initial_model

if TYPE_CHECKING:
    from halyard.train.run_config import TrainConfig

Batch = dict[str, jax.Array]


def initial_params(
    config: TrainConfig,
    layout: Layout,
    mesh: Any,
    manager: CheckpointManager,
    make_state: Callable[[jax.Array], Any],
    abstract: Any,
    shardings: Any,
) -> Any:
    """The parameters the run started from, placed in ``shardings.params``, also when it resumes a later
    checkpoint of its own: the parameters of ``trainer.init``'s checkpoint:PATH or weights:PATH, the model
    of hf:FOLDER, else the initialisation from ``trainer.seed`` (which a resume must keep).

    Args:
        config: the run config.
        layout: the run's layout (an hf: import is read straight into it).
        mesh: the run's mesh.
        manager: the run's checkpoint manager (reads a checkpoint's weights onto this mesh).
        make_state: ``key -> TrainState`` (`Trainer.abstract_state`); only its parameters are computed.
        abstract: the abstract train state.
        shardings: the train state's shardings.
    """
    init = config.trainer.init
    if init.startswith(("checkpoint:", "weights:")):
        path = resolve_checkpoint(init.split(":", 1)[1])
        return manager.restore_weights(path, abstract.params, shardings.params, params_path="params")
    if init.startswith("hf:"):
        return hf_initial_model(config, layout, mesh)
    key = jax.random.PRNGKey(config.trainer.seed)
    return jax.jit(lambda k: make_state(k).params, out_shardings=shardings.params)(key)


def reference_hook(config: TrainConfig, reference: Callable[[], Any]) -> Callable[[Batch], Batch]:
    """``batch -> batch`` run before every step: for ``trainer.objective: dpo`` it adds
    `reference_logprobs` of the frozen reference model (one forward without gradients, jitted); for lm it
    returns the batch as it is.

    Args:
        config: the run config.
        reference: builds the reference model's parameters (called once, only for dpo; `initial_params`).
    """
    if config.trainer.objective != "dpo":
        return lambda batch: batch
    params = reference()
    add = jax.jit(lambda model, batch: {**batch, **reference_logprobs(model, batch)})
    return lambda batch: add(params, batch)
