"""What ``trainer.objective`` changes in a run: the step's loss, the validation, the sequences per example."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from halyard.data import PreferenceDataset
from halyard.shard import Layout
from halyard.train.doremi.loss import doremi_loss_fn
from halyard.train.objectives.dpo import dpo_loss_fn
from halyard.train.objectives.dpo_evaluate import DpoEvaluator
from halyard.train.objectives.lm_evaluate import Evaluator
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.rl.objective import grpo_loss_fn

if TYPE_CHECKING:
    from halyard.train.data_assembly.datasets import PreparedData
    from halyard.train.run_config import TrainConfig


def objective_loss_fn(
    config: TrainConfig,
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """The train step's ``loss_fn``: next-token cross-entropy (lm), the DPO loss (dpo), the GRPO family's
    policy loss (grpo) or DoReMi's proxy loss (doremi)."""
    if config.trainer.objective == "grpo":
        return grpo_loss_fn(config.rl)
    if config.trainer.objective == "doremi":
        return doremi_loss_fn(config.doremi.step_size, config.doremi.smoothing, config.trainer.z_loss_weight)
    if config.trainer.objective == "dpo":
        return dpo_loss_fn(config.dpo.beta, config.dpo.label_smoothing)
    return lm_loss_fn(config.trainer.z_loss_weight, per_example=per_example_losses(config))


def per_example_losses(config: TrainConfig) -> bool:
    """Whether the step returns each example's loss (for the spike test's worst examples): an lm run with
    ``trainer.spikes`` naming examples, without ``trainer.invariant`` (whose slices add every output up)."""
    spikes = config.trainer.spikes
    return (
        config.trainer.objective == "lm"
        and spikes.enabled
        and spikes.worst_examples > 0
        and not config.trainer.invariant
    )


def sequences_per_example(config: TrainConfig) -> int:
    """Sequences of ``data.seq_len`` tokens in one example of the batch: 2 for a DPO pair, else 1."""
    return 2 if config.trainer.objective == "dpo" else 1


def objective_evaluator(
    config: TrainConfig,
    data: PreparedData,
    mesh: Any,
    layout: Layout,
    add_reference: Callable[[dict[str, jax.Array]], dict[str, jax.Array]],
) -> Evaluator | DpoEvaluator | None:
    """The run's periodic validation (None without a validation split): loss, perplexity and bits per
    byte for lm; the DPO loss and rewards for dpo."""
    if data.validation is None:
        return None
    if isinstance(data.validation, PreferenceDataset):
        return DpoEvaluator(data.validation, config, mesh, layout, add_reference)
    return Evaluator(data.validation, config, mesh, layout, data.tokenizer_path)
