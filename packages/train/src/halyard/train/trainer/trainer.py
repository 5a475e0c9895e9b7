"""The Trainer: one code path for the CLI and Python, from a `TrainConfig` to a trained, checkpointed model.

    result = Trainer(config).fit()

Steps: build the mesh and layout, prepare the data, create the state directly in its sharded layout (or
restore it onto this mesh), compile one train step with the state donated, and loop: load -> step ->
log -> checkpoint, with preemption (SIGTERM, or Ctrl-C) saving and exiting with code 143 (130).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from halyard.data import Loader
from halyard.models import MupConfig, lr_multipliers
from halyard.shard import (
    Layout,
    global_batch_from_local,
    is_main_process,
    process_count,
    process_index,
    use_layout,
)
from halyard.train.checkpoint import (
    CheckpointManager,
    CheckpointWriteError,
    KeepPolicy,
    PreemptionFlag,
    SavePolicy,
    install_preemption_handler,
)
from halyard.train.config import save_resolved_config
from halyard.train.lora import (
    checkpoint_metadata,
    join,
    load_lora_base,
    lora_loss_fn,
    trainable_params,
    with_base,
)
from halyard.train.objectives.reference import initial_params, reference_hook
from halyard.train.objectives.run_objective import (
    objective_evaluator,
    objective_loss_fn,
    sequences_per_example,
)
from halyard.train.perf import Goodput
from halyard.train.plot import write_run_plot
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.background_build import start_background_build
from halyard.train.trainer.compilation_cache import cache_counts, use_compilation_cache
from halyard.train.trainer.data import PreparedData
from halyard.train.trainer.harness_eval import periodic_harness
from halyard.train.trainer.initial_state import initial_state, performance_settings
from halyard.train.trainer.metrics_log import MetricsLog
from halyard.train.trainer.out_of_memory import out_of_memory_advice
from halyard.train.trainer.preflight import as_config_error, check_before_data, check_init_source
from halyard.train.trainer.profiling import ProfileWindow
from halyard.train.trainer.sample import sample_text
from halyard.train.trainer.step import TrainState, init_state, make_train_step
from halyard.train.user_errors import RunFailure


class NonFiniteLossError(RunFailure):
    """Training stopped because the loss or gradients were NaN/Inf (see ``trainer.nonfinite``)."""


@dataclass
class FitResult:
    """What `Trainer.fit` returns."""

    state: TrainState
    last_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    sample: str | None = None
    summary: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Trains ``config.model`` on ``config.data`` as ``config.trainer`` says.

    Args:
        config: the run config (`halyard.train.run_config.TrainConfig`).
        preemption: the flag polled each step (default: SIGTERM and SIGINT handlers that `fit` installs and removes).
        clock: time source for checkpoint policies and throughput (tests pass a fake one).
        devices: the devices of the mesh (default: every process's devices; `halyard plan` passes
            simulated ones).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        preemption: PreemptionFlag | None = None,
        clock: Callable[[], float] = time.monotonic,
        devices: Sequence[jax.Device] | None = None,
    ) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.run_dir)
        use_compilation_cache(config.trainer.compilation_cache)  # before this trainer compiles anything
        self.clock = clock
        self._preemption = preemption
        self.mesh = as_config_error("trainer.mesh", lambda: config.trainer.mesh.build(devices))
        self.layout = as_config_error(
            "trainer.layout", lambda: Layout.preset(config.trainer.layout, min_shard=config.trainer.min_shard)
        )
        # The model's shape: the `model:` section, or the config.json of `trainer.init=hf:PATH`.
        self.model_config = self._resolve_model_config()
        # Before any data is prepared: a large cache should not be built for a run that cannot start.
        check_before_data(self)

    # -- pieces --------------------------------------------------------------------------------------
    def _check_model_fits_data(self, data: PreparedData) -> None:
        model: Any = self.model_config
        vocab = int(data.cache.processor_metadata.get("vocab_size", 0))
        if vocab > model.vocab_size:
            raise ValueError(
                f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's vocabulary ({vocab} "
                f"tokens in {data.tokenizer_path}); set model.vocab_size >= {vocab}"
            )

    def build_optimizer(self) -> Any:
        """The run's optax optimizer; muP models get their per-parameter learning-rate multipliers."""
        multipliers = None
        if isinstance(self.model_config, MupConfig):
            abstract_model = jax.eval_shape(self.model_config.init, jax.random.PRNGKey(0))
            multipliers = lr_multipliers(self.model_config, abstract_model)
        return self.config.optimizer.build(
            total_steps=max(self.config.trainer.steps, 1), lr_multipliers=multipliers
        )

    def abstract_state(self, optimizer: Any) -> tuple[Callable[[jax.Array], TrainState], Any, Any]:
        """``(make_state, abstract state, its shardings)``: shapes only, nothing allocated."""
        model_config: Any = self.model_config

        def make_state(key: jax.Array) -> TrainState:  # with LoRA the state's parameters are the adapters
            return init_state(trainable_params(self.config.lora, model_config.init, key), optimizer, key)

        key = jax.random.PRNGKey(self.config.trainer.seed)
        abstract = jax.eval_shape(make_state, key)
        shardings = self.layout.shardings(abstract, self.mesh)
        return make_state, abstract, shardings

    def step_function(self, optimizer: Any, shardings: Any) -> Any:
        """The jitted train step ``(state, batch, frozen) -> (state, metrics)``: state donated, kept in
        ``shardings``; ``frozen`` is a LoRA run's base (`halyard.train.lora`), else None."""
        cfg = self.config.trainer
        return jax.jit(
            make_train_step(
                lora_loss_fn(objective_loss_fn(self.config), self.config.lora),
                optimizer,
                accumulation=cfg.accumulation,
                learning_rate=self.config.optimizer.learning_rate_schedule(max(cfg.steps, 1)),
                join=join if self.config.lora.enabled else None,
            ),
            donate_argnums=0,
            out_shardings=(shardings, None),
        )

    def _resolve_model_config(self) -> Any:
        init = self.config.trainer.init
        if not init.startswith("hf:"):
            return self.config.model
        from halyard.export import read_hf_config

        config, _ = as_config_error(
            f"trainer.init={init}",
            lambda: read_hf_config(
                init.removeprefix("hf:"),
                overrides=performance_settings(self.config),
                strict=self.config.trainer.hf_strict_config,
            ),
        )
        return config

    def restore_state(self, step: int | None = None) -> TrainState:
        """The state saved in this run's ``checkpoints/`` at ``step`` (None: the latest), on this mesh; a LoRA
        run's ``params`` are the whole model, its base (reloaded from the reference) with the adapters.

        Raises:
            CheckpointNotFoundError: no complete checkpoint.
        """
        optimizer = self.build_optimizer()
        _, abstract, shardings = self.abstract_state(optimizer)
        with CheckpointManager(
            self.run_dir / "checkpoints", verify_checksums=self.config.checkpoint.verify_checksums
        ) as manager:
            state = manager.restore(step, abstract, shardings).state
            base = load_lora_base(self.config, self.model_config, self.layout, self.mesh, manager)
        return with_base(state, base.params if base is not None else None)

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to ``trainer.steps`` (resuming when a checkpoint exists) and return the final state.

        Raises:
            SystemExit: with code 143 (SIGTERM) or 130 (Ctrl-C) after saving, when preemption was requested.
            NonFiniteLossError: with ``trainer.nonfinite=stop`` (or too many skipped steps).
        """
        cfg = self.config.trainer
        goodput = Goodput(self.clock)  # started now: time to the first step includes data and state setup
        cache_at_start = cache_counts()
        check_init_source(self.config, self.run_dir / "checkpoints")
        if is_main_process():
            self.run_dir.mkdir(parents=True, exist_ok=True)
        preemption = self._preemption or install_preemption_handler((signal.SIGTERM, signal.SIGINT))
        # Every process tokenizes its share in the background; batches wait for tokens not built yet.
        data, build = start_background_build(self.config.data, self.run_dir, init=cfg.init)
        self._check_model_fits_data(data)
        # A resume must continue the same run: its data order, batch size and seed (the RNG key is restored
        # from the checkpoint, so another trainer.seed would be silently ignored; it is refused instead).
        data_position = {
            "manifest": data.train.manifest.to_dict(),
            "batch_size": cfg.batch_size,
            "trainer_seed": cfg.seed,
        }

        optimizer = self.build_optimizer()
        make_state, abstract, shardings = self.abstract_state(optimizer)
        manager = CheckpointManager(
            self.run_dir / "checkpoints",
            save_policy=SavePolicy(self.config.checkpoint.every_steps, self.config.checkpoint.every_seconds),
            keep_policy=KeepPolicy(self.config.checkpoint.keep_last, self.config.checkpoint.keep_every_steps),
            clock=self.clock,
            verify_checksums=self.config.checkpoint.verify_checksums,
        )
        with out_of_memory_advice(self.config, "creating the training state"):
            # lora.rank > 0: the frozen base, from the reference the run's checkpoints record or trainer.init
            base = load_lora_base(self.config, self.model_config, self.layout, self.mesh, manager)
            frozen = base.params if base is not None else None
            state = initial_state(
                self.config,
                self.layout,
                self.mesh,
                manager,
                optimizer,
                make_state,
                abstract,
                shardings,
                data_position,
            )
        start_step = int(state.step)
        # trainer.objective=dpo: a frozen copy of the weights the run started from scores every batch first.
        with out_of_memory_advice(self.config, "creating the DPO reference model"):
            add_reference = reference_hook(  # with LoRA the reference is the base alone: no second copy
                self.config,
                lambda: (
                    frozen
                    if frozen is not None
                    else initial_params(
                        self.config, self.layout, self.mesh, manager, make_state, abstract, shardings
                    )
                ),
            )
        if is_main_process():  # only a config that got this far (data, model, optimizer, state) is saved
            save_resolved_config(self.config, self.run_dir)
        step_fn = self.step_function(optimizer, shardings)
        log = MetricsLog(
            self.config,
            self.run_dir,
            self.mesh,
            start_step=start_step,
            model_config=self.model_config,
            goodput=goodput,
            clock=self.clock,
        )
        log.extra_metrics = build.metrics  # the build's progress in every logged record
        log.cache_counts_at_start = cache_at_start
        evaluator = objective_evaluator(self.config, data, self.mesh, self.layout, add_reference)
        harness = periodic_harness(  # eval.harness_tasks: lm-eval on the weights in memory
            self.config,
            self.run_dir,
            data.tokenizer_path,
            with_base(state, frozen).params,
            self.mesh,
            self.layout,
        )
        metadata = {"data": data_position, **checkpoint_metadata(base)}
        loader = Loader(
            data.train,
            cfg.batch_size,
            start_step=start_step,
            stop_step=cfg.steps,
            host_index=process_index(),
            host_count=process_count(),
        )
        profile = ProfileWindow(self.run_dir, cfg.profile_start, cfg.profile_steps)
        tokens_per_step = cfg.batch_size * self.config.data.seq_len * sequences_per_example(self.config)
        # Activation sharding constraints in model code (halyard.shard.constrain) follow this run's layout
        # (part of jit's cache key, so the step compiles with them); without it FSDP runs ~2x slower.
        try:
            with use_layout(self.layout, self.mesh), loader:
                for step in range(start_step, cfg.steps):
                    local = build.next_batch(loader, log)
                    batch = add_reference(global_batch_from_local(local, self.mesh, layout=self.layout))
                    log.before_step()
                    profile.before_step(step)
                    # Compile-time exhaustion raises here; a run-time one where the metrics are fetched.
                    with out_of_memory_advice(self.config, f"compiling or running train step {step + 1}"):
                        state, metrics = step_fn(state, batch, frozen)
                        profile.after_step(step, metrics)
                        fetched = log.after_step(step + 1, metrics, tokens=tokens_per_step)
                    self._apply_nonfinite_policy(metrics, state, fetched=fetched)
                    if evaluator is not None and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
                        log.record_eval(step + 1, *evaluator.evaluate(with_base(state, frozen).params))
                    if harness is not None and harness.due(step + 1):
                        log.record_eval(
                            step + 1, *harness.evaluate(with_base(state, frozen).params, step + 1)
                        )
                    if preemption.requested_on_any_process():
                        with log.checkpoint_timer():
                            self._save(manager, step + 1, state, metadata, wait=True)
                        log.close()
                        raise SystemExit(preemption.exit_code)
                    with log.checkpoint_timer():
                        self._save(manager, step + 1, state, metadata, only_when_due=True)
            with log.checkpoint_timer():
                if int(state.step) > 0:
                    self._save(manager, int(state.step), state, metadata)
                manager.wait()
            final_step = int(state.step)
            evaluated_in_loop = (
                bool(cfg.eval_every) and final_step % cfg.eval_every == 0 and final_step > start_step
            )
            if evaluator is not None and not evaluated_in_loop:
                log.record_eval(final_step, *evaluator.evaluate(with_base(state, frozen).params))
            if harness is not None and harness.last_step != final_step:
                log.record_eval(final_step, *harness.evaluate(with_base(state, frozen).params, final_step))
            sample = (
                sample_text(with_base(state, frozen), data.tokenizer_path, cfg) if cfg.sample_prompt else None
            )
            if sample is not None and is_main_process():
                print(
                    f"\n--- sample after step {int(state.step)} ---\n{cfg.sample_prompt}{sample}\n---",
                    flush=True,
                )
        finally:
            if self._preemption is None:  # the handlers fit installed: Ctrl-C interrupts again afterwards
                preemption.uninstall()
            build.close()
            profile.close()
            manager.close()
        summary = log.close()
        if is_main_process():  # the loss against the step, for a look instead of a read of metrics.jsonl
            write_run_plot(self.run_dir)
        return FitResult(
            state=state, last_metrics=log.last, history=log.history, sample=sample, summary=summary
        )

    def _save(
        self,
        manager: CheckpointManager,
        step: int,
        state: TrainState,
        metadata: dict[str, Any],
        *,
        only_when_due: bool = False,
        wait: bool = False,
    ) -> None:
        """Save a checkpoint of ``state`` (with ``only_when_due``: if the save policy wants one now).

        A failed earlier background write surfaces here: with ``checkpoint.on_write_error=retry`` it is
        reported on stderr and this save is its retry; with ``stop`` the `CheckpointWriteError` propagates.
        """
        try:
            if only_when_due:
                manager.maybe_save(step, state, metadata)
            else:
                manager.save(step, state, metadata, wait=wait)
        except CheckpointWriteError as error:
            if self.config.checkpoint.on_write_error != "retry":
                raise
            print(
                f"warning: {error}. Training continues and saves again now (checkpoint.on_write_error=retry)",
                file=sys.stderr,
                flush=True,
            )
            manager.save(step, state, metadata, wait=wait)

    def _apply_nonfinite_policy(self, metrics: dict[str, Any], state: TrainState, *, fetched: bool) -> None:
        """Stop on a non-finite step (``stop``: checked every step, a host sync) or on too many skipped
        steps (``skip``: checked whenever metrics were fetched anyway, so the step pipeline keeps flowing)."""
        cfg = self.config.trainer
        if cfg.nonfinite == "stop":
            if int(metrics["nonfinite"]):
                raise NonFiniteLossError(
                    f"loss or gradient norm is not finite at step {int(state.step)}; the update was not applied "
                    "and no checkpoint newer than the last finite state is written (trainer.nonfinite=stop)"
                )
        elif fetched and int(state.nonfinite_steps) > cfg.max_nonfinite_steps:
            raise NonFiniteLossError(
                f"{int(state.nonfinite_steps)} steps had a non-finite loss (more than "
                f"trainer.max_nonfinite_steps={cfg.max_nonfinite_steps}); stopping"
            )
