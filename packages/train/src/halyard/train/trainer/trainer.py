"""The Trainer: one code path for the CLI and Python, from a `TrainConfig` to a trained, checkpointed model.

    result = Trainer(config).fit()

The Trainer composes the run's pieces: `halyard.train.run.setup.RunSetup` derives the mesh, layout, model,
schedule, optimizer and abstract state from the config (each once); `halyard.train.trainer.session` starts
the data, the state (created in its sharded layout, or restored onto this mesh), the compiled step (state
donated), the log and the evaluations; `fit` loops load -> step -> log -> evaluate -> checkpoint, with
preemption (SIGTERM, or Ctrl-C) saving and exiting with code 143 (130).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from halyard.shard import global_batch_from_local, is_main_process, use_layout
from halyard.shard.compilation_cache import cache_counts, use_compilation_cache
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.preemption import PreemptionFlag, install_preemption_handler
from halyard.train.lora.adapters import with_base
from halyard.train.perf.goodput import Goodput
from halyard.train.plot import write_run_plot
from halyard.train.rl.fit import fit_rl
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import load_lora_base
from halyard.train.run.unfused import fused_multiply_add_note
from halyard.train.run_config import TrainConfig
from halyard.train.step import TrainState
from halyard.train.trainer.interruption import (
    RunInterrupted,
    before_steps,
    signalled_on_any_process,
    stop_run,
)
from halyard.train.trainer.out_of_memory import out_of_memory_advice
from halyard.train.trainer.preflight import check_before_data, check_init_source
from halyard.train.trainer.run_folder import RunFolder
from halyard.train.trainer.sample import sample_text
from halyard.train.trainer.session import TrainingSession, start_session
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
        self.setup = RunSetup(config, devices=devices)
        # Before any data is prepared: a large cache should not be built for a run that cannot start.
        check_before_data(self.setup)

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.setup.mesh

    @property
    def layout(self) -> Any:
        return self.setup.layout

    @property
    def model_config(self) -> Any:
        """The model's config: the ``model:`` section, or the config.json of ``trainer.init=hf:PATH``."""
        return self.setup.model_config

    def restore_state(self, step: int | None = None) -> TrainState:
        """The state saved in this run's ``checkpoints/`` at ``step`` (None: the latest), on this mesh; a LoRA
        run's ``params`` are the whole model, its base (reloaded from the reference) with the adapters.

        Raises:
            CheckpointNotFoundError: no complete checkpoint.
        """
        setup = self.setup
        with CheckpointManager(
            self.run_dir / "checkpoints", verify_checksums=self.config.checkpoint.verify_checksums
        ) as manager:
            state = manager.restore(step, *setup.abstract_state).state
            base = load_lora_base(self.config, setup.model_config, setup.layout, setup.mesh, manager)
        return with_base(state, base.params if base is not None else None)

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to ``trainer.steps`` (resuming when a checkpoint exists) and return the final state.

        Raises:
            SystemExit: with code 143 (SIGTERM) or 130 (Ctrl-C) after saving, when preemption was requested;
                before the first step, at once (nothing is saved).
            NonFiniteLossError: with ``trainer.nonfinite=stop`` (or too many skipped steps).
        """
        goodput = Goodput(self.clock)  # started now: time to the first step includes data and state setup
        cache_at_start = cache_counts()
        preemption = self._preemption or install_preemption_handler((signal.SIGTERM, signal.SIGINT))
        try:
            if signalled_on_any_process(preemption):  # a signal while the run was set up: nothing written
                stop_run(preemption, "before the run started; nothing was written", main=is_main_process())
            check_init_source(self.config, self.run_dir / "checkpoints")
            self._say_what_the_learning_rate_does()
            self._say_whether_fused_multiply_adds_break_invariance()
            if self.config.trainer.objective == "grpo":
                state, log = fit_rl(self.setup, self.run_dir, self.clock, preemption, goodput, cache_at_start)
                return self._result(state, log, None)
            # Bad input found before the first step (an empty corpus) leaves no half-made run folder behind.
            with RunFolder(self.run_dir, writes=is_main_process()) as folder:
                session = start_session(self.setup, self.run_dir, goodput, self.clock)
                session.log.cache_counts_at_start = cache_at_start
                try:
                    # Activation sharding constraints in model code (halyard.shard.constrain) follow this run's
                    # layout (part of jit's cache key, so the step compiles with them); without it FSDP runs ~2x
                    # slower.
                    with use_layout(self.layout, self.mesh), session.loader:
                        state = self._train_steps(session, preemption, folder)
                    sample = self._finish(session, state, preemption)
                finally:
                    session.close()
        except RunInterrupted as interrupted:
            interrupted.report()  # last, after what closing the session printed
            raise
        finally:
            if self._preemption is None:  # the handlers fit installed: Ctrl-C interrupts again afterwards
                preemption.uninstall()
        return self._result(state, session.log, sample)

    def _result(self, state: TrainState, log: Any, sample: str | None) -> FitResult:
        """Close the log (its goodput summary), draw the loss curve, and gather what `fit` returns."""
        summary = log.close()
        if self.config.trainer.plot and is_main_process():  # a look instead of a read of metrics.jsonl
            write_run_plot(self.run_dir)
        return FitResult(
            state=state, last_metrics=log.last, history=log.history, sample=sample, summary=summary
        )

    def _say_what_the_learning_rate_does(self) -> None:
        """Continuing a finished run: one line on the learning rate of the added steps (trainer.continue_schedule)."""
        note = self.setup.schedule_note()
        if note is not None and is_main_process():
            print(note, flush=True)

    def _say_whether_fused_multiply_adds_break_invariance(self) -> None:
        """trainer.invariant in a process whose CPU programs have fused multiply-adds: one line."""
        if not self.config.trainer.invariant:
            return
        note = fused_multiply_add_note(
            "trainer.invariant", "steps on another device count or sharding may differ in their last bits"
        )
        if note is not None and is_main_process():
            print(note, flush=True)

    def _train_steps(
        self, session: TrainingSession, preemption: PreemptionFlag, folder: RunFolder
    ) -> TrainState:
        """Steps from the session's start to ``trainer.steps``: load, step, log, evaluate, checkpoint."""
        state, log = session.state, session.log
        if signalled_on_any_process(preemption):  # while the data, the state and the step were prepared
            log.close(quiet=True)
            stop_run(preemption, before_steps(session.start_step), main=is_main_process())
        for step in range(session.start_step, self.config.trainer.steps):
            local = session.build.next_batch(session.loader, log)
            batch = session.add_reference(global_batch_from_local(local, self.mesh, layout=self.layout))
            log.before_step()
            session.profile.before_step(step)
            # Compile-time exhaustion raises here; a run-time one where the metrics are fetched.
            with out_of_memory_advice(self.config, f"compiling or running train step {step + 1}"):
                state, metrics = session.step_for(step + 1)(state, batch, session.frozen)
                session.profile.after_step(step, metrics)
                fetched = log.after_step(step + 1, metrics, tokens=session.tokens_per_step)
            self._apply_nonfinite_policy(metrics, state, fetched=fetched)
            folder.keep()
            session.evaluate(step + 1, state)
            if preemption.requested_on_any_process():
                session.save(step + 1, state, wait=True)
                log.close()
                where = f"at step {step + 1}; checkpoint saved; run the same command to resume"
                stop_run(preemption, where, main=is_main_process())
            session.save(step + 1, state, only_when_due=True)
        return state

    def _finish(self, session: TrainingSession, state: TrainState, preemption: PreemptionFlag) -> str | None:
        """After the last step: the final checkpoint (waited for), the evaluations that did not run at this
        step, and the sample of ``trainer.sample_prompt`` (printed, and returned)."""
        final_step = int(state.step)
        if final_step > 0:
            session.save(final_step, state)
        with session.log.checkpoint_timer():
            session.manager.wait()
        if signalled_on_any_process(preemption):  # the last evaluation and the sample are skipped
            session.log.close()
            stop_run(preemption, f"at step {final_step}, the last; checkpoint saved", main=is_main_process())
        session.evaluate(final_step, state, final=True)
        cfg = self.config.trainer
        if not cfg.sample_prompt:
            return None
        sample = sample_text(with_base(state, session.frozen), session.data.tokenizer_path, cfg)
        if is_main_process():
            print(f"\n--- sample after step {final_step} ---\n{cfg.sample_prompt}{sample}\n---", flush=True)
        return sample

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
