"""`RunSetup`: every value a run derives from its config, each derived once, in one place.

    setup = RunSetup(config)               # the mesh, the layout and the model config, now
    setup.schedule, setup.optimizer        # built on first use, then kept
    setup.abstract_state                   # the train state's shapes and shardings: nothing allocated
    setup.train_step()                     # the jitted step, state donated

The Trainer, `halyard plan`, the loaders of `generate` / `eval` / `export` and the harness all start here, so
they agree on the mesh, the layout and the model; only what a caller uses is built (loading weights never
builds an optimizer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property
from typing import Any, NamedTuple

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from halyard.models import MupConfig, lr_multipliers
from halyard.named.nn import offload_supported
from halyard.shard import Layout
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.config.errors import ConfigError
from halyard.train.doremi.state import with_domain_weights
from halyard.train.doremi.step import make_doremi_step
from halyard.train.lora.adapters import join, lora_loss_fn, trainable_params
from halyard.train.objectives.run_objective import objective_loss_fn
from halyard.train.optim.state_placement import host_shardings, with_host_state, with_state_dtype
from halyard.train.run.canonical import canonical_slices
from halyard.train.run.mesh_record import mesh_record
from halyard.train.run.schedule_plan import SchedulePlan, run_schedule_plan
from halyard.train.run.sources import model_config_of, source_model
from halyard.train.run_config import TrainConfig
from halyard.train.step import TrainState, init_state, make_train_step
from halyard.train.user_errors import as_config_error
from halyard.train.watch.config import WatchConfig


class Placed(NamedTuple):
    """A tree of shapes (``jax.ShapeDtypeStruct`` leaves) and the sharding of each leaf on the run's mesh."""

    abstract: Any
    shardings: Any


class RunSetup:
    """The run's mesh, layout, model config, schedule, optimizer and abstract state.

    Args:
        config: the run config.
        devices: the mesh's devices (default: every process's; `halyard plan` passes simulated ones).

    Raises:
        ConfigError: a mesh that does not fit the devices, an unknown layout, an ``hf:`` folder whose
            config.json is refused (naming the key); the lazily built values raise theirs on first use.
    """

    def __init__(self, config: TrainConfig, *, devices: Sequence[jax.Device] | None = None) -> None:
        self.config = config
        self.mesh = as_config_error("trainer.mesh", lambda: config.trainer.mesh.build(devices))
        self.layout = as_config_error(
            "trainer.layout", lambda: Layout.preset(config.trainer.layout, min_shard=config.trainer.min_shard)
        )
        # The model's shape: the `model:` section, or the config.json of `trainer.init=hf:PATH`.
        self.model_config: Any = model_config_of(config)

    @cached_property
    def schedule_plan(self) -> SchedulePlan:
        """The steps the schedule spans: ``trainer.steps``, or, continuing a finished run, what
        ``trainer.continue_schedule`` says (read from the run folder's latest checkpoint)."""
        return run_schedule_plan(self.config)

    @property
    def schedule_steps(self) -> int:
        """The optimizer steps the schedule's last segment spans: ``trainer.steps`` for a run started anew."""
        return self.schedule_plan.last_length

    @cached_property
    def schedule(self) -> optax.Schedule:
        """The learning rate as a function of the optimizer's update count."""
        return as_config_error(
            "optimizer.schedule",
            lambda: self.schedule_plan.schedule(self.config.optimizer.learning_rate_schedule),
        )

    def schedule_note(self) -> str | None:
        """One line on what the learning rate does when the run continues a finished schedule, else None."""
        cfg = self.config.trainer
        peak = self.config.optimizer.learning_rate
        return self.schedule_plan.describe(self.schedule, cfg.steps, cfg.continue_schedule, peak)

    @cached_property
    def optimizer(self) -> optax.GradientTransformationExtraArgs:
        """The run's optax optimizer on `schedule`; muP models get per-parameter learning-rate multipliers."""
        multipliers = None
        if isinstance(self.model_config, MupConfig):
            abstract_model = jax.eval_shape(self.model_config.init, jax.random.PRNGKey(0))
            multipliers = lr_multipliers(self.model_config, abstract_model)
        schedule = self.schedule
        optimizer = self.config.optimizer
        if self.config.trainer.invariant:  # the invariant step clips, with its canonical norm
            optimizer = dataclasses.replace(optimizer, max_grad_norm=None)
        built = as_config_error(
            "optimizer", lambda: optimizer.build(schedule=schedule, lr_multipliers=multipliers)
        )
        model: Any = self.model_config
        if model.optimizer != model.params:
            built = with_state_dtype(built, model.optimizer)
        if self.config.trainer.offload_optimizer_state:
            built = with_host_state(built)
        if self.config.trainer.objective == "doremi":  # the domain weights live beside its state, in float32
            domains = len(self.config.data.mixture.sources)
            return with_domain_weights(built, [1.0 / domains] * domains)
        return built

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What each checkpoint records for the next start: the schedule's segments and the mesh."""
        return {**self.schedule_plan.metadata(), **mesh_record(self.config, self.mesh)}

    def init_trained(self, key: jax.Array) -> Any:
        """``key -> what the state trains``: the model, or a LoRA run's adapters."""
        return trainable_params(self.config.lora, self.model_config.init, key)

    def init_state(self, key: jax.Array) -> TrainState:
        """A fresh step-0 train state from ``key`` (builds the optimizer)."""
        return init_state(self.init_trained(key), self.optimizer, key)

    @cached_property
    def abstract_state(self) -> Placed:
        """The train state's shapes and shardings: nothing allocated."""
        abstract = jax.eval_shape(self.init_state, jax.random.PRNGKey(self.config.trainer.seed))
        shardings = self.layout.shardings(abstract, self.mesh)
        if self.config.trainer.offload_optimizer_state:
            device = self.mesh.devices.flat[0]
            if not offload_supported(device):
                raise ConfigError(
                    f"trainer.offload_optimizer_state: the {device.platform} device has no pinned_host "
                    "memory to keep the optimizer state in; set it to false"
                )
            shardings = dataclasses.replace(shardings, opt_state=host_shardings(shardings.opt_state))
        return Placed(abstract, shardings)

    @cached_property
    def abstract_trained(self) -> Placed:
        """The shapes and shardings of what the state trains, without building the optimizer (loading)."""
        if "abstract_state" in self.__dict__:
            state = self.abstract_state
            return Placed(state.abstract.params, state.shardings.params)
        abstract = jax.eval_shape(self.init_trained, jax.random.PRNGKey(self.config.trainer.seed))
        return Placed(abstract, self.layout.shardings(abstract, self.mesh))

    def initial_model(self, manager: CheckpointManager) -> Any:
        """What the state trained from at step 0 (DPO's reference), also when the run resumes a later
        checkpoint of its own: ``trainer.init``'s source, or the initialisation from ``trainer.seed``, which
        a resume keeps.

        Args:
            manager: reads a ``checkpoint:`` / ``weights:`` source onto this mesh.
        """
        abstract, shardings = self.abstract_trained
        return source_model(
            self.config.trainer.init,
            self.config,
            self.init_trained,
            abstract,
            shardings,
            layout=self.layout,
            mesh=self.mesh,
            manager=manager,
        )

    def _watch(self) -> WatchConfig:
        """``trainer.watch``, without the model's reports where the step cannot carry them out (the invariant
        step adds its slices' outputs up; the pipeline's stages run under a vmap): preflight refuses asking
        for them there, and `halyard replay` gets the norms alone."""
        watch = self.config.trainer.watch
        stages = dict(self.mesh.shape).get("stage", 1)
        if self.config.trainer.invariant or stages > 1:
            return dataclasses.replace(watch, model=False)
        return watch

    def train_step(self, *, watched: bool = False) -> Any:
        """The jitted train step ``(state, batch, frozen) -> (state, metrics)``: the state donated and kept in
        its shardings, the metrics on every device (each process reads them whole); ``frozen`` is a LoRA run's
        base, else None. ``watched``: the step of ``trainer.watch``, with its statistics in the metrics."""
        config = self.config
        invariant = canonical_slices(config, self.mesh, self.layout)
        step = make_train_step(
            lora_loss_fn(objective_loss_fn(config), config.lora),
            self.optimizer,
            accumulation=config.trainer.accumulation,
            learning_rate=self.schedule,
            join=join if config.lora.enabled else None,
            invariant=invariant,
            watch=self._watch() if watched else None,
            check_update_first=config.optimizer.elementwise,
        )
        if config.trainer.objective == "doremi":  # the reference's forward and the weights' step around it
            step = make_doremi_step(step, config.trainer.z_loss_weight)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return jax.jit(step, donate_argnums=0, out_shardings=(self.abstract_state.shardings, replicated))
