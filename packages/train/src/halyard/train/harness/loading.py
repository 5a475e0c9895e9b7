"""The model to evaluate: a training run's checkpoint (weights only, on the run's mesh) or a Hugging Face
folder, with the tokenizer that goes with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax

from halyard.models import CausalLM
from halyard.shard import Layout
from halyard.train.checkpoint import CheckpointManager
from halyard.train.config import ConfigError
from halyard.train.lora import join, load_lora_base


@dataclass(frozen=True)
class LoadedModel:
    """A model and what evaluating it needs.

    Attributes:
        model: the parameters, placed on ``mesh`` when there is one.
        tokenizer: path of its tokenizer (a tokenizer.json or a folder).
        step: the checkpoint's step (None for a Hugging Face folder).
        vocab_size: the ids the softmax runs over (None: `HalyardLM`'s default).
        mesh, layout: the run's, or None.
    """

    model: CausalLM
    tokenizer: str
    step: int | None = None
    vocab_size: int | None = None
    mesh: jax.sharding.Mesh | None = None
    layout: Layout | None = None


def load_run_model(run_dir: str | Path, step: int | None = None) -> LoadedModel:
    """The weights of a run's checkpoint at ``step`` (None: the latest complete one), placed on the run's mesh
    and layout as training placed them (the optimizer state is not read).

    Raises:
        ConfigError: no ``config.yaml`` in ``run_dir``, no complete checkpoint, or no checkpoint at ``step``.
    """
    from halyard.train.run_tools import load_run_config
    from halyard.train.trainer.data import tokenizer_path_of
    from halyard.train.trainer.trainer import Trainer

    run = Path(run_dir)
    config = load_run_config(run)
    checkpoints = run / "checkpoints"
    with CheckpointManager(checkpoints, verify_checksums=config.checkpoint.verify_checksums) as manager:
        steps = manager.complete_steps() if checkpoints.is_dir() else []
        if not steps:
            raise ConfigError(
                f"{run} has no complete checkpoint under {checkpoints}: train it first (halyard train --config "
                f"{run / 'config.yaml'}), or evaluate a Hugging Face folder with --hf"
            )
        if step is not None and step not in steps:
            raise ConfigError(f"--step {step}: {run} has checkpoints at steps {', '.join(map(str, steps))}")
        step = steps[-1] if step is None else step
        trainer = Trainer(config)
        _, abstract, shardings = trainer.abstract_state(trainer.build_optimizer())
        params = manager.restore_weights(step, abstract.params, shardings.params, params_path="params")
        base = load_lora_base(config, trainer.model_config, trainer.layout, trainer.mesh, manager)
        if base is not None:  # a LoRA run's weights are its adapters: join them to the base
            params = join(base.params, params)
    tokenizer = tokenizer_path_of(config.data, run, init=config.trainer.init)
    return LoadedModel(params, tokenizer, step=step, mesh=trainer.mesh, layout=trainer.layout)


def load_hf_model(folder: str | Path) -> LoadedModel:
    """A Hugging Face folder's model on one device, its tokenizer, and its checkpoint's vocabulary size.

    Raises:
        HfConversionError: a missing config.json or weights, or an unsupported architecture.
    """
    from halyard.export import import_hf, read_hf_config

    _, info = read_hf_config(folder)
    _, model = import_hf(folder)
    return LoadedModel(model, str(folder), vocab_size=info.vocab_size)
