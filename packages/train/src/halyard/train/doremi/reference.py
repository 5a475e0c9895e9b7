"""The reference model of a proxy run: its weights, read once onto the proxy's shardings, handed to every step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from halyard.train.checkpoint.discovery import resolve_checkpoint
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.doremi.step import REFERENCE_MODEL

Batch = dict[str, jax.Array]


def reference_model_hook(
    reference: str, abstract_params: Any, shardings: Any, manager: CheckpointManager
) -> Callable[[Batch], Batch]:
    """``batch -> batch`` adding the reference model's parameters under `REFERENCE_MODEL`.

    Args:
        reference: ``doremi.reference``: a run folder, a checkpoint root or a step folder.
        abstract_params: the proxy's parameters' shapes (the reference must have the same).
        shardings: the proxy's parameters' shardings; the reference's are the same.
        manager: reads the checkpoint.

    Raises:
        CheckpointNotFoundError: no complete checkpoint there.
    """
    path = resolve_checkpoint(reference)
    params = manager.restore_weights(path, abstract_params, shardings, params_path="params")
    return lambda batch: {**batch, REFERENCE_MODEL: params}
