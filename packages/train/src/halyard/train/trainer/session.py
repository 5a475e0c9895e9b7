"""A training session: what `Trainer.fit` starts before its first step (data, state, step, log, evaluations,
loader) and the few operations its loop needs on them (save, evaluate, close)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from halyard.data import Loader
from halyard.shard import batch_share, is_main_process
from halyard.train.checkpoint.manager import CheckpointManager, CheckpointWriteError
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy
from halyard.train.config.parse import save_resolved_config
from halyard.train.data_assembly.datasets import PreparedData
from halyard.train.data_assembly.positions import example_position
from halyard.train.data_assembly.run_data import start_background_build
from halyard.train.doremi.reference import reference_model_hook
from halyard.train.lora.adapters import with_base
from halyard.train.lora.base import checkpoint_metadata
from halyard.train.objectives.reference import reference_hook
from halyard.train.objectives.run_objective import objective_evaluator, sequences_per_example
from halyard.train.perf.goodput import Goodput
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import load_lora_base
from halyard.train.run_config import TrainConfig
from halyard.train.step import TrainState
from halyard.train.trainer.evaluations import PeriodicEvaluation, PeriodicValidation
from halyard.train.trainer.harness_eval import periodic_harness
from halyard.train.trainer.initial_state import initial_state
from halyard.train.trainer.metrics_log import MetricsLog
from halyard.train.trainer.out_of_memory import out_of_memory_advice
from halyard.train.trainer.preflight import check_model_fits_data
from halyard.train.trainer.profiling import ProfileWindow

Batch = dict[str, jax.Array]


@dataclass
class TrainingSession:
    """The started pieces of one `Trainer.fit`.

    Attributes:
        setup: the run's derived values (mesh, layout, optimizer, abstract state).
        data: the train and validation splits and the tokenizer.
        build: the background cache build (batches wait on it; closed with the session).
        manager: the run's checkpoint manager.
        state: the state the first step starts from.
        frozen: a LoRA run's frozen base (the train step's third argument), else None.
        add_reference: ``batch -> batch`` before each step (DPO's reference log-probabilities, DoReMi's
            reference model).
        metadata: what each checkpoint records besides the state (data position, LoRA base).
        step_fn: the jitted train step.
        watched_step_fn: the jitted step of ``trainer.watch`` (the same update, with its statistics), or None.
        log: metrics, trackers and goodput.
        evaluations: validation and harness tasks, in that order.
        loader: this host's batches from the first step on.
        profile: the profiler window.
        tokens_per_step: tokens in one global batch.
        start_step: the step the state is at.
    """

    setup: RunSetup
    data: PreparedData
    build: Any
    manager: CheckpointManager
    state: TrainState
    frozen: Any
    add_reference: Callable[[Batch], Batch]
    metadata: dict[str, Any]
    step_fn: Callable[..., Any]
    watched_step_fn: Callable[..., Any] | None
    log: MetricsLog
    evaluations: list[PeriodicEvaluation]
    loader: Loader
    profile: ProfileWindow
    tokens_per_step: int
    start_step: int

    def step_for(self, step: int) -> Callable[..., Any]:
        """The compiled step that runs step ``step`` (1-based: the count after its update): the watched one at
        the steps ``trainer.watch.every`` names."""
        if self.watched_step_fn is not None and self.setup.config.trainer.watch.watches(step):
            return self.watched_step_fn
        return self.step_fn

    def model(self, state: TrainState) -> Any:
        """The whole model of ``state`` (a LoRA run's base joined with its adapters)."""
        return with_base(state, self.frozen).params

    def evaluate(self, step: int, state: TrainState, *, final: bool = False) -> None:
        """Run the evaluations due after ``step`` steps (``final``: each that has not evaluated ``step``)."""
        for evaluation in self.evaluations:
            if evaluation.due(step) if not final else evaluation.last_step != step:
                self.log.record_eval(step, *evaluation.evaluate(self.model(state), step))

    def save(self, step: int, state: TrainState, *, only_when_due: bool = False, wait: bool = False) -> None:
        """Save a checkpoint of ``state`` (with ``only_when_due``: if the save policy wants one now).

        A failed earlier background write surfaces here: with ``checkpoint.on_write_error=retry`` it is
        reported on stderr and this save is its retry; with ``stop`` the `CheckpointWriteError` propagates.
        """
        with self.log.checkpoint_timer():
            try:
                if only_when_due:
                    self.manager.maybe_save(step, state, self.metadata)
                else:
                    self.manager.save(step, state, self.metadata, wait=wait)
            except CheckpointWriteError as error:
                if self.setup.config.checkpoint.on_write_error != "retry":
                    raise
                print(
                    f"warning: {error}. Training continues and saves again now (checkpoint.on_write_error=retry)",
                    file=sys.stderr,
                    flush=True,
                )
                self.manager.save(step, state, self.metadata, wait=wait)

    def close(self) -> None:
        """Stop the background build, the profiler and the checkpoint manager."""
        self.build.close()
        self.profile.close()
        self.manager.close()


def run_data_position(config: TrainConfig, data: PreparedData) -> dict[str, Any]:
    """What each checkpoint records of the data, which a resume (and `halyard replay`) must find unchanged:
    the data order, the batch size and the seed (the RNG key is restored from the checkpoint, so another
    ``trainer.seed`` would be silently ignored; it is refused instead)."""
    return {
        "manifest": data.train.manifest.to_dict(),
        "batch_size": config.trainer.batch_size,
        "trainer_seed": config.trainer.seed,
    }


def start_session(
    setup: RunSetup, run_dir: Path, goodput: Goodput, clock: Callable[[], float]
) -> TrainingSession:
    """Everything up to the first step: the data (built in the background), the state (restored or
    created in its sharded layout), the compiled step, the log, the evaluations and the loader.

    Args:
        setup: the run's derived values.
        run_dir: the run folder (it exists).
        goodput: the run's goodput accounting (started when `fit` started).
        clock: time source for checkpoint policies and throughput.
    """
    config = setup.config
    cfg = config.trainer
    # Every process tokenizes its share in the background; batches wait for tokens not built yet.
    data, build = start_background_build(config.data, run_dir, init=cfg.init)
    check_model_fits_data(setup.model_config, data)
    data_position = run_data_position(config, data)
    manager = CheckpointManager(
        run_dir / "checkpoints",
        save_policy=SavePolicy(config.checkpoint.every_steps, config.checkpoint.every_seconds),
        keep_policy=KeepPolicy(config.checkpoint.keep_last, config.checkpoint.keep_every_steps),
        clock=clock,
        verify_checksums=config.checkpoint.verify_checksums,
    )
    with out_of_memory_advice(config, "creating the training state"):
        # lora.rank > 0: the frozen base, from the reference the run's checkpoints record or trainer.init
        base = load_lora_base(config, setup.model_config, setup.layout, setup.mesh, manager)
        frozen = base.params if base is not None else None
        state = initial_state(setup, manager, data_position)
    with out_of_memory_advice(config, "creating the reference model"):
        add_reference = reference_hook(
            config, lambda: frozen if frozen is not None else setup.initial_model(manager)
        )
        if cfg.objective == "doremi":  # DoReMi's reference, frozen, sharded like the proxy
            add_reference = reference_model_hook(config.doremi.reference, *setup.abstract_trained, manager)
    if is_main_process():  # only a config that got this far (data, model, optimizer, state) is saved
        save_resolved_config(config, run_dir)
    step_fn = setup.train_step()
    host_index, host_count = batch_share(setup.mesh, setup.layout)  # the rows this process's devices hold
    start_step = int(state.step)
    return TrainingSession(
        setup=setup,
        data=data,
        build=build,
        manager=manager,
        state=state,
        frozen=frozen,
        add_reference=add_reference,
        metadata={"data": data_position, **checkpoint_metadata(base), **setup.checkpoint_metadata()},
        step_fn=step_fn,
        watched_step_fn=setup.train_step(watched=True) if cfg.watch.enabled else None,
        log=_metrics_log(setup, run_dir, data, build, start_step, goodput, clock),
        evaluations=_evaluations(setup, run_dir, data, add_reference, with_base(state, frozen).params),
        loader=Loader(
            data.train,
            cfg.batch_size,
            start_step=start_step,
            stop_step=cfg.steps,
            host_index=host_index,
            host_count=host_count,
        ),
        profile=ProfileWindow(run_dir, cfg.profile_start, cfg.profile_steps),
        tokens_per_step=cfg.batch_size * config.data.seq_len * sequences_per_example(config),
        start_step=start_step,
    )


def _metrics_log(
    setup: RunSetup,
    run_dir: Path,
    data: PreparedData,
    build: Any,
    start_step: int,
    goodput: Goodput,
    clock: Callable[[], float],
) -> MetricsLog:
    """The run's log: its trackers from ``start_step`` on, the build's progress in every record, and the data
    position of a batch row (named with a loss spike's worst examples)."""
    batch_size = setup.config.trainer.batch_size
    log = MetricsLog(
        setup.config,
        run_dir,
        setup.mesh,
        start_step=start_step,
        model_config=setup.model_config,
        goodput=goodput,
        clock=clock,
        locate=lambda step, row: example_position(data.train, step=step, row=row, batch_size=batch_size),
    )
    log.extra_metrics = build.metrics  # the build's progress in every logged record
    return log


def _evaluations(
    setup: RunSetup, run_dir: Path, data: PreparedData, add_reference: Callable[[Batch], Batch], model: Any
) -> list[PeriodicEvaluation]:
    """The run's validation (with a validation split) and harness tasks (``eval.harness_tasks``)."""
    config = setup.config
    evaluations: list[PeriodicEvaluation] = []
    validator = objective_evaluator(config, data, setup.mesh, setup.layout, add_reference)
    if validator is not None:
        evaluations.append(PeriodicValidation(validator, config.trainer.eval_every))
    harness = periodic_harness(config, run_dir, data.tokenizer_path, model, setup.mesh, setup.layout)
    if harness is not None:
        evaluations.append(harness)
    return evaluations
