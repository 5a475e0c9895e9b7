"""muP's per-parameter learning-rate multipliers."""

from __future__ import annotations

from typing import Any

import jax

from halyard.models.decoder import Decoder
from halyard.models.families.mup.config import MupConfig


def lr_multipliers(config: MupConfig, params: Any) -> Any:
    """Per-parameter learning-rate multipliers for muP, with the structure of ``params``.

    Every hidden matrix (attention and MLP projections) and the unembedding get ``d_base / hidden_size``;
    the token embedding and norm gains get 1. The result is ``params`` with each array replaced by a
    Python float, so ``jax.tree.map(lambda update, m: update * m, updates, multipliers)`` scales an
    optimizer's updates leaf by leaf (NamedArrays line up because their array is their only leaf).

    Args:
        config: the model's `MupConfig`.
        params: the muP `Decoder` (or any pytree with its structure, e.g. its gradients).

    Raises:
        TypeError: ``params`` is not a muP model-shaped tree.
    """
    if not isinstance(params, Decoder) or not isinstance(params.config, MupConfig):
        raise TypeError(f"lr_multipliers expects a muP model (or its gradients), got {type(params).__name__}")
    hidden = config.d_base / config.hidden_size

    def multiplier(path: tuple[Any, ...], _: Any) -> float:
        names = [getattr(entry, "name", "") for entry in path]
        if "embed" in names or "attention_norm" in names or "mlp_norm" in names or "final_norm" in names:
            return 1.0
        if "bias" in names:
            return 1.0
        return hidden

    return jax.tree_util.tree_map_with_path(multiplier, params)
