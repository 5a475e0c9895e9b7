"""The language-model loss as the train step wants it: token sums over a loader batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.models import LmBatch


def lm_loss_fn(
    z_loss_weight: float = 0.0,
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` for `make_train_step`.

    ``batch`` is the loader's dict: ``tokens`` and ``segment_ids``, int ``[rows, seq_len + 1]``, and for
    chat / prompt-completion data ``loss_mask`` (1 where the token is a training target). The model's
    summed loss (``reduction="sum"``) over the counted tokens makes accumulation exactly token-weighted.

    A mixture's batch also holds ``source_one_hot`` int ``[rows, sources]``; then the stats add
    ``source_loss`` and ``source_tokens`` ``[sources]``: the loss summed over each source's target tokens
    (an auxiliary loss, MoE's, shared out by tokens) and their count, which add up to the total loss and
    ``num_tokens``.
    """

    def loss_fn(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        lm_batch = LmBatch.from_tokens(batch["tokens"], batch.get("segment_ids"), batch.get("loss_mask"))
        if "source_one_hot" in batch:
            return _loss_by_source(model, lm_batch, batch["source_one_hot"], key, z_loss_weight)
        loss, metrics = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="sum")
        stats = {name: _plain(value) for name, value in metrics.items()}
        return _plain(loss), stats

    return loss_fn


def _loss_by_source(
    model: Any, lm_batch: LmBatch, source_one_hot: jax.Array, key: jax.Array, z_loss_weight: float
) -> tuple[jax.Array, dict]:
    # Per-position losses (reduction "none") carry the auxiliary loss on every position; weighted by the 0/1
    # loss mask their sum is the summed loss of reduction "sum", and their row sums split it by source.
    per_position, metrics = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="none")
    weights = lm_batch.loss_mask.array.astype(jnp.float32)
    counted = _plain(per_position) * weights
    if counted.shape != weights.shape:
        raise ValueError(f"per-position loss of shape {counted.shape} for a batch of shape {weights.shape}")
    stats = {name: _plain(value) for name, value in metrics.items()}
    stats["cross_entropy"] = jnp.sum(stats["cross_entropy"])
    stats["z_loss"] = jnp.sum(stats["z_loss"])
    one_hot = source_one_hot.astype(jnp.float32)
    stats["source_loss"] = counted.sum(axis=1) @ one_hot
    stats["source_tokens"] = weights.sum(axis=1) @ one_hot
    return jnp.sum(counted), stats


def _plain(value: Any) -> jax.Array:
    return value.array if hasattr(value, "axes") else value
