"""Where a run's model comes from: the ``model:`` section, or a Hugging Face folder (``trainer.init=hf:``),
a checkpoint's weights (``checkpoint:`` / ``weights:``) or the initialisation from ``trainer.seed``; each read
straight into the run's layout. The one place that turns a source into weights: the initial state, a LoRA
run's frozen base and DPO's reference all load through here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from halyard.export import import_hf, read_hf_config
from halyard.models import DecoderConfig, ModelConfig
from halyard.shard import Layout
from halyard.train.checkpoint.discovery import resolve_checkpoint
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.lora.base import LoraBase, base_reference, base_source, recorded_reference
from halyard.train.run_config import TrainConfig
from halyard.train.user_errors import as_config_error

CHECKPOINT_FIELDS = ("eos_token_ids",)
"""Fields every family shares that describe the checkpoint itself; the other shared fields of `ModelConfig`
are settings of the run (kernels, remat, dtypes) that the ``model:`` section applies to an imported config."""


def run_settings(config: TrainConfig) -> dict[str, Any]:
    """The ``model:`` section's values of the fields every family shares (`ModelConfig`'s, and a decoder's
    `DecoderSpec` ones such as ``quantization``, less `CHECKPOINT_FIELDS`), by name: applied on top of the
    config.json of ``trainer.init=hf:``."""
    shared_by = DecoderConfig if isinstance(config.model, DecoderConfig) else ModelConfig
    shared = (field.name for field in dataclasses.fields(shared_by))
    return {name: getattr(config.model, name) for name in shared if name not in CHECKPOINT_FIELDS}


def model_config_of(config: TrainConfig) -> Any:
    """The run's model config: ``config.model``, or the config.json of ``trainer.init=hf:PATH`` with the
    ``model:`` section's `run_settings`.

    Raises:
        ConfigError: the folder's config.json cannot be read or is refused (naming ``trainer.init``).
    """
    init = config.trainer.init
    if not init.startswith("hf:"):
        return config.model

    model_config, _ = as_config_error(
        f"trainer.init={init}",
        lambda: read_hf_config(
            init.removeprefix("hf:"), overrides=run_settings(config), strict=config.trainer.hf_strict_config
        ),
    )
    return model_config


def hf_model(config: TrainConfig, layout: Layout, mesh: Any) -> Any:
    """The model of ``trainer.init: hf:FOLDER``, read straight into ``layout`` on ``mesh``, with the
    ``model:`` section's `run_settings`."""
    _, model = import_hf(
        config.trainer.init.removeprefix("hf:"),
        layout=layout,
        mesh=mesh,
        config_overrides=run_settings(config),
        strict=config.trainer.hf_strict_config,
    )
    return model


def source_model(
    source: str,
    config: TrainConfig,
    init_model: Callable[[jax.Array], Any],
    abstract: Any,
    shardings: Any,
    *,
    layout: Layout,
    mesh: Any,
    manager: CheckpointManager,
) -> Any:
    """The model ``source`` names, placed in ``shardings``.

    Args:
        source: ``hf:PATH`` (must be ``trainer.init`` itself), ``checkpoint:PATH`` / ``weights:PATH`` (that
            checkpoint's parameters), anything else: ``init_model`` drawn from ``trainer.seed``.
        config: the run config.
        init_model: ``key -> model`` for a fresh initialisation.
        abstract, shardings: the model's shapes and placement.
        layout, mesh: the run's (a Hugging Face folder is read straight into them).
        manager: reads a checkpoint's weights onto this mesh.
    """
    if source.startswith("hf:"):
        return hf_model(config, layout, mesh)
    if source.startswith(("checkpoint:", "weights:")):
        path = resolve_checkpoint(source.split(":", 1)[1])
        return manager.restore_weights(path, abstract, shardings, params_path="params")
    return jax.jit(init_model, out_shardings=shardings)(jax.random.PRNGKey(config.trainer.seed))


def load_lora_base(
    config: TrainConfig, model_config: Any, layout: Layout, mesh: Any, manager: CheckpointManager
) -> LoraBase | None:
    """The frozen base of a LoRA run, placed in ``layout`` on ``mesh`` (None without LoRA): the base the
    run's latest checkpoint records, else ``trainer.init``'s.

    Raises:
        ConfigError: see `halyard.train.lora.base.base_source`.
    """
    if not config.lora.enabled:
        return None
    latest = manager.latest_step() if manager.directory.is_dir() else None
    recorded = recorded_reference(manager.step_path(latest)) if latest is not None else None
    source = base_source(config, recorded)
    abstract = jax.eval_shape(model_config.init, jax.random.PRNGKey(0))
    shardings = layout.shardings(abstract, mesh)
    params = source_model(
        source, config, model_config.init, abstract, shardings, layout=layout, mesh=mesh, manager=manager
    )
    return LoraBase(params, base_reference(config, source))
