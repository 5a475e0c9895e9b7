"""Periodic validation of a DPO run: the DPO loss and the reward metrics on held-out pairs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from halyard.data import PreferenceDataset
from halyard.shard import Layout, batch_share, global_batch_from_local
from halyard.train.objectives.dpo import dpo_loss_fn

if TYPE_CHECKING:
    from halyard.train.run_config import TrainConfig


class DpoEvaluator:
    """Evaluates a model on the first ``trainer.eval_batches`` validation pairs' batches (the same each time).

    Metrics: ``eval_loss`` (the mean DPO loss) and ``eval_`` + each train metric of `dpo_loss_fn`
    (``eval_rewards/accuracies``, ...), means over the evaluated pairs.

    Args:
        dataset: the validation pairs.
        config: the run config (``trainer.batch_size``, ``trainer.eval_batches``, the ``dpo:`` section).
        mesh: the run's mesh.
        layout: the run's layout.
        add_reference: the run's `reference_hook` (adds the reference's log-probabilities to a batch).
    """

    def __init__(
        self,
        dataset: PreferenceDataset,
        config: TrainConfig,
        mesh: Any,
        layout: Layout,
        add_reference: Callable[[dict[str, jax.Array]], dict[str, jax.Array]],
    ) -> None:
        self.dataset = dataset
        self.config = config
        self.mesh = mesh
        self.layout = layout
        self.add_reference = add_reference
        loss_fn = dpo_loss_fn(config.dpo.beta, config.dpo.label_smoothing)
        self._loss = jax.jit(lambda model, batch: loss_fn(model, batch, jax.random.PRNGKey(0)))

    def evaluate(self, model: Any) -> tuple[dict[str, float], float]:
        """``({eval_loss, eval_rewards/..., eval_logps/...}, seconds taken)``."""
        started = time.monotonic()
        size = self.config.trainer.batch_size
        totals: dict[str, float] = {}
        host_index, host_count = batch_share(self.mesh, self.layout)
        for index in range(self.config.trainer.eval_batches):
            local = self.dataset.batch(index, size, host_index=host_index, host_count=host_count)
            batch = self.add_reference(global_batch_from_local(local, self.mesh, layout=self.layout))
            loss_sum, stats = self._loss(model, batch)
            for name, value in {"loss": loss_sum, **stats}.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        pairs = max(totals.pop("num_tokens"), 1.0)
        metrics = {f"eval_{name}": value / pairs for name, value in totals.items()}
        return metrics, time.monotonic() - started
