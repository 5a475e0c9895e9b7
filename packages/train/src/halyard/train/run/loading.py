"""Loading a run's model without training it: its config, and the weights of one checkpoint on the run's
mesh (weights only: no optimizer is built and no optimizer state is read), or a Hugging Face folder.

    loaded = load_run_model("runs/demo")            # the latest complete checkpoint
    loaded.model, loaded.step, loaded.tokenizer

`halyard generate`, `eval`, `export` and the lm-eval harness load through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from halyard.export import import_hf, read_hf_config
from halyard.models import CausalLM
from halyard.models.lora import Adapters
from halyard.shard import Layout
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config
from halyard.train.data_assembly.tokenizer import tokenizer_path_of
from halyard.train.lora.adapters import join
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import load_lora_base
from halyard.train.run_config import TrainConfig


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The resolved config a run saved in ``run_dir/config.yaml``.

    Raises:
        ConfigError: the run folder has no config.yaml.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{path} does not exist: --run must name a training run folder (trainer.run_dir)")
    return parse_config(TrainConfig, [], path)


@dataclass(frozen=True)
class LoadedModel:
    """A model and what using it needs.

    Attributes:
        model: the parameters (a LoRA run's: the base joined with the adapters), placed on ``mesh`` when
            there is one.
        tokenizer: path of its tokenizer (a tokenizer.json or a folder).
        step: the checkpoint's step (None for a Hugging Face folder).
        vocab_size: the ids the softmax runs over (None: all of the model's).
        mesh, layout: the run's, or None.
        config: the run's config (None for a Hugging Face folder).
    """

    model: CausalLM
    tokenizer: str
    step: int | None = None
    vocab_size: int | None = None
    mesh: jax.sharding.Mesh | None = None
    layout: Layout | None = None
    config: Any = None


def checkpoint_step(run_dir: Path, manager: CheckpointManager, step: int | None) -> int:
    """``step``, or the latest complete checkpoint's when None, checked to exist.

    Raises:
        ConfigError: no complete checkpoint, or none at ``step`` (naming the steps there are).
    """
    steps = manager.complete_steps() if manager.directory.is_dir() else []
    if not steps:
        raise ConfigError(
            f"No complete checkpoint to load: {run_dir} has no complete checkpoint under {manager.directory}: "
            "train it first (halyard train "
            f"--config {run_dir / 'config.yaml'}), or evaluate a Hugging Face folder with --hf"
        )
    if step is not None and step not in steps:
        raise ConfigError(
            f"--step {step}: no checkpoint at step {step} in {run_dir}; available: {', '.join(map(str, steps))}"
        )
    return steps[-1] if step is None else step


def load_run_model(run_dir: str | Path, step: int | None = None) -> LoadedModel:
    """The weights of a run's checkpoint at ``step`` (None: the latest complete one), placed on the run's mesh
    and layout as training placed them (the optimizer state is not read).

    Raises:
        ConfigError: no ``config.yaml`` in ``run_dir``, no complete checkpoint, or no checkpoint at ``step``.
    """
    run = Path(run_dir)
    config = load_run_config(run)
    setup = RunSetup(config)
    checkpoints = run / "checkpoints"
    with CheckpointManager(checkpoints, verify_checksums=config.checkpoint.verify_checksums) as manager:
        step = checkpoint_step(run, manager, step)
        abstract, shardings = setup.abstract_trained
        params = manager.restore_weights(step, abstract, shardings, params_path="params")
        base = load_lora_base(config, setup.model_config, setup.layout, setup.mesh, manager)
        if base is not None:  # a LoRA run's weights are its adapters: join them to the base
            params = join(base.params, params)
    tokenizer = tokenizer_path_of(config.data, run, init=config.trainer.init)
    return LoadedModel(params, tokenizer, step=step, mesh=setup.mesh, layout=setup.layout, config=config)


def load_run_adapters(run_dir: str | Path, step: int | None = None) -> Adapters:
    """The LoRA adapters a run trained (``{"q_proj": LoraAdapter, ...}``) at ``step`` (None: the latest
    complete checkpoint), on the default device; its base is not read.

    Raises:
        ConfigError: no ``config.yaml``, a run trained without LoRA, no complete checkpoint or none at ``step``.
    """
    run = Path(run_dir)
    config = load_run_config(run)
    if not config.lora.enabled:
        raise ConfigError(
            f"{run} trained no LoRA adapters (lora.rank is 0): serve it as the base with --run, not with --lora"
        )
    setup = RunSetup(config)
    with CheckpointManager(
        run / "checkpoints", verify_checksums=config.checkpoint.verify_checksums
    ) as manager:
        step = checkpoint_step(run, manager, step)
        abstract, shardings = setup.abstract_trained
        adapters = manager.restore_weights(step, abstract, shardings, params_path="params")
    return jax.device_put(jax.device_get(adapters))  # off the run's mesh, onto the one device serving uses


def load_hf_model(folder: str | Path) -> LoadedModel:
    """A Hugging Face folder's model on one device, its tokenizer, and its checkpoint's vocabulary size.

    Raises:
        HfConversionError: a missing config.json or weights, or an unsupported architecture.
    """
    _, info = read_hf_config(folder)
    _, model = import_hf(folder)
    return LoadedModel(model, str(folder), vocab_size=info.vocab_size)
