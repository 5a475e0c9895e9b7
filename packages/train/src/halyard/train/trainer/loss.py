"""The language-model loss as the train step wants it: token sums over a loader batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from halyard.models import LmBatch


def lm_loss_fn(
    z_loss_weight: float = 0.0,
) -> Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict]]:
    """``loss_fn(model, batch, key) -> (loss_sum, stats)`` for `make_train_step`.

    ``batch`` is the loader's dict: ``tokens`` and ``segment_ids``, int ``[rows, seq_len + 1]``, and for
    chat / prompt-completion data ``loss_mask`` (1 where the token is a training target). The model's
    summed loss (``reduction="sum"``) over the counted tokens makes accumulation exactly token-weighted.
    """

    def loss_fn(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        lm_batch = LmBatch.from_tokens(batch["tokens"], batch.get("segment_ids"), batch.get("loss_mask"))
        loss, metrics = model.loss(lm_batch, key=key, z_loss_weight=z_loss_weight, reduction="sum")
        stats = {name: value.array if hasattr(value, "axes") else value for name, value in metrics.items()}
        return loss.array if hasattr(loss, "axes") else loss, stats

    return loss_fn
