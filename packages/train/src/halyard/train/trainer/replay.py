"""Recomputing one step of a run exactly: from the checkpoint before it, with the programs the run ran.

    replay = replay_step("runs/demo", 31)
    replay.loss, replay.logged        # the same bits, when the run logged that step
    replay.examples                   # each row: its loss, its documents and offsets, their own losses
    replay.statistics                 # the watched step's statistics of step 31 (per layer, per module)

The checkpoint at or before step ``N - 1`` is restored onto the run's mesh; the steps between it and ``N`` are
trained again with the run's compiled programs (the watched one where ``trainer.watch`` ran it), then step
``N`` itself. A batch is a pure function of (data manifest, seed, step), so the bits are the run's when the
mesh is (the same device count and layout). The statistics come from the watched program on a copy of the
state before step ``N``; the per-token losses from the model on that state, outside the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import LmBatch
from halyard.models.context_order import balanced_batch
from halyard.shard import batch_share, global_batch_from_local, use_layout
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.datasets import PreparedData
from halyard.train.data_assembly.positions import example_position
from halyard.train.data_assembly.run_data import prepare_data
from halyard.train.lora.adapters import with_base
from halyard.train.plot import metrics_file
from halyard.train.run.loading import load_run_config
from halyard.train.run.mesh_record import mesh_record, resume_note
from halyard.train.run.setup import RunSetup
from halyard.train.run.sources import load_lora_base
from halyard.train.step import TrainState
from halyard.train.trackers.jsonl import read_jsonl
from halyard.train.trainer.session import run_data_position
from halyard.train.watch.spikes import read_spikes


@dataclass
class ReplayedExample:
    """One row of the replayed batch: its loss per counted token, its data position (`example_position`:
    example, window, stream token, documents) and each document's own loss over the tokens predicted in it."""

    row: int
    loss: float
    tokens: int
    position: dict[str, Any]
    documents: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Replay:
    """What `replay_step` found.

    Attributes:
        step: the replayed step (1-based: the step count after its update).
        checkpoint: the step of the checkpoint it started from.
        loss: the step's loss (float32, as the run computed it).
        logged: the loss the run logged for that step (metrics.jsonl or spikes.jsonl), or None.
        examples: the batch's rows, worst loss per token first.
        statistics: the watched step's statistics (``name -> array``; per layer ``<name>/layers``).
        metrics: the step's other scalar metrics (grad_norm, ...).
        tokenizer_path: the run's tokenizer (for showing the documents' text).
        mesh_note: one line when this replay's mesh or process count is not the checkpoint's (the bits then
            differ), else None.
    """

    step: int
    checkpoint: int
    loss: np.float32
    logged: float | None
    examples: list[ReplayedExample]
    statistics: dict[str, np.ndarray]
    metrics: dict[str, float]
    tokenizer_path: str
    mesh_note: str | None = None

    @property
    def same_bits(self) -> bool | None:
        """Whether the loss has the logged bits (None: the run did not log this step's loss)."""
        return None if self.logged is None else bool(np.float32(self.logged) == self.loss)


def replay_step(run_dir: str | Path, step: int) -> Replay:
    """Recompute step ``step`` of the run in ``run_dir`` (see the module docstring).

    Raises:
        ConfigError: not a run folder, a step below 1, a DPO run, or no checkpoint before the step.
    """
    run = Path(run_dir)
    config = load_run_config(run)
    if config.trainer.objective != "lm":
        raise ConfigError(
            f"halyard replay recomputes trainer.objective=lm runs; {run} trains {config.trainer.objective}"
        )
    if step < 1:
        raise ConfigError(f"--step {step}: steps count from 1 (the step count after the update)")
    setup = RunSetup(config)
    data = prepare_data(config.data, run, progress=False, init=config.trainer.init)
    start, state, frozen, saved = _restore_before(setup, data, run, step)
    plain, watched = setup.train_step(), setup.train_step(watched=True)
    program = lambda at: (
        watched if config.trainer.watch.watches(at) else plain
    )  # the run's choice at each step
    with use_layout(setup.layout, setup.mesh):
        for earlier in range(start + 1, step):
            state, _ = program(earlier)(state, _batch(setup, data, earlier), frozen)
        batch = _batch(setup, data, step)
        token_losses = _token_losses(with_base(state, frozen).params, batch)
        statistics = {}
        if program(step) is plain:  # the statistics from the watched program, on a copy of the same state
            _, watched_metrics = watched(jax.tree.map(jnp.copy, state), batch, frozen)
            statistics = jax.device_get(watched_metrics["watch"])
        state, metrics = program(step)(state, batch, frozen)
        metrics = jax.device_get(metrics)
    statistics = {
        name: np.asarray(value) for name, value in (metrics.pop("watch", None) or statistics).items()
    }
    metrics.pop("histograms", None)
    examples = _examples(data, config.trainer.batch_size, step, np.asarray(batch["tokens"]), token_losses)
    return Replay(
        step=step,
        checkpoint=start,
        loss=np.float32(metrics["loss"]),
        logged=_logged_loss(run, step),
        examples=examples,
        statistics=statistics,
        metrics={name: float(value) for name, value in metrics.items() if not isinstance(value, dict)},
        tokenizer_path=data.tokenizer_path,
        mesh_note=resume_note(saved, mesh_record(config, setup.mesh)),
    )


def _restore_before(
    setup: RunSetup, data: PreparedData, run: Path, step: int
) -> tuple[int, TrainState, Any, dict[str, Any]]:
    """``(its step, the state, a LoRA run's frozen base or None, its metadata)`` of the newest checkpoint at or
    before ``step - 1``, on the run's mesh; a checkpoint written for other data is refused."""
    config = setup.config
    with CheckpointManager(
        run / "checkpoints", verify_checksums=config.checkpoint.verify_checksums
    ) as manager:
        start = _checkpoint_before(manager, step, run)
        abstract, shardings = setup.abstract_state
        restored = manager.restore(start, abstract, shardings, expected_data=run_data_position(config, data))
        base = load_lora_base(config, setup.model_config, setup.layout, setup.mesh, manager)
    return start, restored.state, base.params if base is not None else None, restored.extra_metadata


def _checkpoint_before(manager: CheckpointManager, step: int, run: Path) -> int:
    """The newest complete checkpoint at or before ``step - 1``."""
    steps = manager.complete_steps()
    earlier = [saved for saved in steps if saved <= step - 1]
    if not earlier:
        kept = ", ".join(str(saved) for saved in steps) or "none"
        raise ConfigError(
            f"{run} has no checkpoint at or before step {step - 1} to replay step {step} from (it holds: {kept}); "
            "keep older checkpoints with checkpoint.keep_every_steps or checkpoint.keep_last"
        )
    return earlier[-1]


def _batch(setup: RunSetup, data: PreparedData, step: int) -> dict[str, jax.Array]:
    """The global batch of ``step`` (1-based) on the run's mesh, as the trainer's loader and step see it."""
    host_index, host_count = batch_share(setup.mesh, setup.layout)
    local = data.train.batch(step - 1, setup.config.trainer.batch_size, host_index, host_count)
    return global_batch_from_local(local, setup.mesh, layout=setup.layout)


@eqx.filter_jit
def _token_losses(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Each position's loss and whether it counts, ``[rows, seq_len]`` each, in the batch's position order."""
    lm_batch = LmBatch.from_tokens(batch["tokens"], batch.get("segment_ids"), batch.get("loss_mask"))
    per_position, _ = model.loss(lm_batch, reduction="none")
    balanced, order = balanced_batch(lm_batch)  # context parallelism's order: back to the batch's
    weights = balanced.loss_mask.array.astype(jnp.float32)
    losses = per_position * weights
    if order is not None:
        losses = jnp.zeros_like(losses).at[:, order.array].set(losses)
        weights = jnp.zeros_like(weights).at[:, order.array].set(weights)
    return losses, weights


def _examples(
    data: PreparedData,
    batch_size: int,
    step: int,
    tokens: np.ndarray,
    token_losses: tuple[jax.Array, jax.Array],
) -> list[ReplayedExample]:
    """Every row of the batch, worst loss per counted token first, each with its documents' own losses (the
    loss at position ``t`` predicts token ``t + 1`` and belongs to that token's document)."""
    losses = np.asarray(token_losses[0], np.float64)
    counted = np.asarray(token_losses[1]) > 0
    examples = []
    for row in range(losses.shape[0]):
        position = example_position(data.train, step=step - 1, row=row, batch_size=batch_size) or {"row": row}
        tokens_counted = int(counted[row].sum())
        example = ReplayedExample(
            row, float(losses[row].sum() / max(tokens_counted, 1)), tokens_counted, position
        )
        start = 0
        for document in position.get("documents", []):
            stop = start + document["tokens"]
            predicted = slice(max(start - 1, 0), stop - 1)  # positions whose target lies in this document
            count = int(counted[row, predicted].sum())
            example.documents.append(
                {
                    **document,
                    "loss": float(losses[row, predicted].sum() / max(count, 1)),
                    "predicted": count,
                    "token_ids": tokens[row, start:stop].tolist(),
                }
            )
            start = stop
        example.documents.sort(key=lambda doc: -doc["loss"])
        examples.append(example)
    return sorted(examples, key=lambda example: -example.loss)


def _logged_loss(run: Path, step: int) -> float | None:
    """The loss the run logged for ``step``: its metrics line, else its spike record; None if neither."""
    try:
        for line in read_jsonl(metrics_file(run)):
            if line.get("step") == step and isinstance(line.get("loss"), int | float):
                return float(line["loss"])
    except ConfigError:  # a run without a jsonl tracker
        pass
    for record in read_spikes(run):
        if record.get("step") == step:
            return float(record["loss"])
    return None
