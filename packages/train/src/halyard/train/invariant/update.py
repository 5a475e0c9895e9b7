"""The invariant step's optimizer update: clipped with the canonical norm, run where the weights are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def isolated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` between optimization barriers, so XLA cannot fold its arithmetic into what comes before or after.

    The update then runs on each device's shard (FSDP) or on whole leaves (1 device, data parallel) with the
    same bits: elementwise arithmetic rounds the same on a shard as on the whole leaf. Without the barriers
    (and the step's barrier after the division by the token count) XLA simplified the division, the
    clipping and AdamW differently in a shard's program and in a whole leaf's, and an fsdp-8 run parted from
    1 device's at step 1 in a third of the second moments' elements.
    """

    def between_barriers(*args: Any) -> Any:
        return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

    return between_barriers


def clip_to_norm(grads: Any, norm: jax.Array, max_norm: float) -> Any:
    """``grads`` scaled to L2 norm ``max_norm`` when their ``norm`` is above it (optax's
    ``clip_by_global_norm`` with a given norm); elementwise, so the same bits on any sharding."""
    keep = norm < max_norm
    return jax.tree_util.tree_map(
        lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * jnp.asarray(max_norm, g.dtype)), grads
    )
