"""The language-model loss as the train step wants it: token sums over a loader batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.models import LmBatch
from halyard.models.context_order import balanced_batch


def lm_loss_fn(
    z_loss_weight: float = 0.0, *, per_example: bool = False
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` for `make_train_step`.

    ``batch`` is the loader's dict: ``tokens`` and ``segment_ids``, int ``[rows, seq_len + 1]``, and for
    chat / prompt-completion data ``loss_mask`` (1 where the token is a training target). The model's
    summed loss (``reduction="sum"``) over the counted tokens makes accumulation exactly token-weighted.

    A mixture's batch also holds ``source_one_hot`` int ``[rows, sources]``; then the stats add
    ``source_loss`` and ``source_tokens`` ``[sources]``: the loss summed over each source's target tokens
    (an auxiliary loss, MoE's, shared out by tokens) and their count, which add up to the total loss and
    ``num_tokens``.

    With ``per_example`` the stats add ``example_loss`` and ``example_tokens`` ``[rows]`` (each row's loss sum
    and counted tokens; the step's `halyard.train.step.EXAMPLE_STATS`): the loss is then summed from the
    per-position losses, as for a mixture.
    """

    def loss_fn(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        lm_batch = LmBatch.from_tokens(batch["tokens"], batch.get("segment_ids"), batch.get("loss_mask"))
        if "source_one_hot" in batch or per_example:
            return _loss_by_rows(
                model, lm_batch, batch.get("source_one_hot"), key, z_loss_weight, per_example
            )
        loss, metrics = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="sum")
        stats = {name: _plain(value) for name, value in metrics.items()}
        return _plain(loss), stats

    return loss_fn


def _loss_by_rows(
    model: Any,
    lm_batch: LmBatch,
    source_one_hot: jax.Array | None,
    key: jax.Array,
    z_loss_weight: float,
    per_example: bool,
) -> tuple[jax.Array, dict]:
    # Per-position losses (reduction "none") carry the auxiliary loss on every position; weighted by the 0/1
    # loss mask their sum is the summed loss of reduction "sum", and their row sums split it by source. The
    # model returns them in its own position order (context parallelism's load-balanced one): the mask is
    # taken in the same order.
    per_position, metrics = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="none")
    weights = balanced_batch(lm_batch)[0].loss_mask.array.astype(jnp.float32)
    counted = _plain(per_position) * weights
    if counted.shape != weights.shape:
        raise ValueError(f"per-position loss of shape {counted.shape} for a batch of shape {weights.shape}")
    stats = {name: _plain(value) for name, value in metrics.items()}
    stats["cross_entropy"] = jnp.sum(stats["cross_entropy"])
    stats["z_loss"] = jnp.sum(stats["z_loss"])
    row_losses, row_tokens = counted.sum(axis=1), weights.sum(axis=1)
    if source_one_hot is not None:
        one_hot = source_one_hot.astype(jnp.float32)
        stats["source_loss"] = row_losses @ one_hot
        stats["source_tokens"] = row_tokens @ one_hot
    if per_example:
        stats["example_loss"], stats["example_tokens"] = row_losses, row_tokens
    return jnp.sum(counted), stats


def _plain(value: Any) -> jax.Array:
    return value.array if hasattr(value, "axes") else value
