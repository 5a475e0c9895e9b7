"""The proxy model's loss: Group DRO over the mixture's domains against the reference model's losses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.models import LmBatch
from halyard.models.context_order import balanced_batch
from halyard.train.doremi.weights import excess_losses, updated_weights, weighted_domain_loss

DOMAIN_STATS = ("domain_weights", "excess_loss")
"""The proxy step's per-domain figures (``[domains]``, not token sums): this step's weights and excess losses."""


def per_position_loss(model: Any, batch: dict[str, jax.Array], key: jax.Array, z_loss_weight: float) -> Any:
    """``(loss [rows, pos], target [rows, pos])``: the model's loss of every position of a loader batch and 1
    where the position is a target, both in the model's own position order (context parallelism's)."""
    lm_batch = LmBatch.from_tokens(batch["tokens"], batch.get("segment_ids"), batch.get("loss_mask"))
    losses, _ = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="none")
    target = balanced_batch(lm_batch)[0].loss_mask.array.astype(jnp.float32)
    return _plain(losses).astype(jnp.float32), target


def doremi_loss_fn(
    step_size: float, smoothing: float, z_loss_weight: float = 0.0
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` of the proxy model (`halyard.train.step.LossFn`).

    ``batch`` is a mixture's batch (``tokens``, ``segment_ids``, ``source_one_hot``) with what the proxy's step
    adds: ``reference_loss`` ``[rows, pos]`` (the reference model's per-position loss) and ``domain_weights``
    ``[domains]`` (the weights of the previous step). From the batch's excess losses the function takes the
    weights' step (`updated_weights`) and returns the weighted sum of the domains' mean losses, times the
    target tokens (the step divides by them). Stats: ``num_tokens``, ``source_loss`` and ``source_tokens``
    (sums, as `halyard.train.objectives.lm_loss.lm_loss_fn` gives them), and `DOMAIN_STATS`.
    """

    def loss_fn(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        losses, target = per_position_loss(model, batch, key, z_loss_weight)
        one_hot = batch["source_one_hot"].astype(jnp.float32)
        excess, tokens = excess_losses(
            jax.lax.stop_gradient(losses), batch["reference_loss"], target, one_hot
        )
        weights = updated_weights(batch["domain_weights"], excess, step_size=step_size, smoothing=smoothing)
        domain_sums = (losses * target).sum(axis=1) @ one_hot
        num_tokens = target.sum()
        objective = weighted_domain_loss(domain_sums, tokens, weights)
        stats = {
            "num_tokens": num_tokens,
            "source_loss": domain_sums,
            "source_tokens": tokens,
            "domain_weights": weights,
            "excess_loss": excess,
        }
        return objective * jnp.maximum(num_tokens, 1.0), stats

    return loss_fn


def _plain(value: Any) -> jax.Array:
    return value.array if hasattr(value, "axes") else value
