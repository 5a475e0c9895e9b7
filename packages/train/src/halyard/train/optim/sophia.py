"""Sophia-H: clipped momentum preconditioned by a Hutchinson estimate of the diagonal Hessian.

Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model Pre-training",
Algorithm 3 with the Hutchinson estimator: every `update_interval` steps draw Rademacher `u`, estimate
`h_hat = u * (H u)` with one Hessian-vector product of the loss, and keep an EMA `h`; every step

    m = beta1 * m + (1 - beta1) * g
    update = clip(m / max(gamma * h, epsilon), -clip_threshold, clip_threshold)

(the learning rate and weight decay are chained on afterwards). The Hessian refreshed at a step is used in
that same step, so the first update is already preconditioned.

The Hessian-vector product needs the loss, so the update takes it as an extra argument (optax's
`GradientTransformationExtraArgs`):

    updates, opt_state = optimizer.update(grads, opt_state, params, loss_fn=lambda p: loss(p, batch))

`loss_fn(params) -> scalar` is the (mean) loss of one batch or microbatch at the current step; inside a
jitted step over sharded params it is a global computation, so no cross-device averaging is needed. Other
optimizers built here accept and ignore `loss_fn`, so a trainer can always pass it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class SophiaHState(NamedTuple):
    """Sophia-H state: steps taken, momentum, EMA of the diagonal Hessian, and the estimator's PRNG key."""

    steps: jax.Array
    momentum: Any
    hessian: Any
    key: jax.Array


def hutchinson_diagonal_hessian(loss_fn: Callable[[Any], jax.Array], params: Any, key: jax.Array) -> Any:
    """An unbiased estimate of the Hessian's diagonal: `u * (H u)` for random signs `u`.

    Args:
        loss_fn: scalar loss as a function of the parameters.
        params: the point at which the Hessian is taken (any pytree, NamedArray leaves included).
        key: PRNG key for the Rademacher vector.

    Returns:
        A pytree like `params` holding the estimate.
    """
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    signs = jax.tree.unflatten(
        treedef,
        [
            jax.random.rademacher(k, leaf.shape, dtype=leaf.dtype)
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )
    _, hessian_vector = jax.jvp(jax.grad(loss_fn), (params,), (signs,))
    return jax.tree.map(lambda sign, product: sign * product, signs, hessian_vector)


def scale_by_sophia_h(
    *,
    beta1: float,
    beta2: float,
    gamma: float,
    epsilon: float,
    clip_threshold: float,
    update_interval: int,
    seed: int,
) -> optax.GradientTransformationExtraArgs:
    """Sophia-H's direction (before learning rate and weight decay); needs `loss_fn=` in `update`. The
    settings are `SophiaHConfig`'s fields, where their defaults live.

    Args:
        beta1: momentum decay.
        beta2: decay of the Hessian EMA (applied once per refresh, i.e. every `update_interval` steps).
        gamma: scale of the Hessian in the denominator (the paper's rho); larger is more conservative.
        epsilon: floor of the denominator (where the curvature is ~0 or negative the update is clipped sign).
        clip_threshold: per-coordinate bound of the update (1 in the paper; the learning rate scales it).
        update_interval: refresh the Hessian estimate every this many steps (the paper's k, 10).
        seed: seed of the Rademacher vectors.

    Raises:
        ValueError: from `update` when `loss_fn` or `params` is missing.
    """
    if update_interval < 1:
        raise ValueError(f"update_interval must be at least 1, got {update_interval}.")

    def init(params: Any) -> SophiaHState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return SophiaHState(jnp.zeros([], jnp.int32), zeros, zeros, jax.random.key(seed))

    def update(
        grads: Any,
        state: SophiaHState,
        params: Any = None,
        *,
        loss_fn: Callable[[Any], jax.Array] | None = None,
        **extra_args: Any,
    ) -> tuple[Any, SophiaHState]:
        del extra_args
        if params is None or loss_fn is None:
            raise ValueError(
                "sophia_h needs the parameters and the loss for its Hessian estimate: call "
                "optimizer.update(grads, state, params, loss_fn=lambda p: loss(p, batch))."
            )
        momentum = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state.momentum, grads)
        key, estimate_key = jax.random.split(state.key)

        def refreshed(hessian: Any) -> Any:
            estimate = hutchinson_diagonal_hessian(loss_fn, params, estimate_key)
            return jax.tree.map(lambda h, e: beta2 * h + (1 - beta2) * e.astype(h.dtype), hessian, estimate)

        hessian = jax.lax.cond(state.steps % update_interval == 0, refreshed, lambda h: h, state.hessian)
        updates = jax.tree.map(
            lambda m, h: jnp.clip(m / jnp.maximum(gamma * h, epsilon), -clip_threshold, clip_threshold),
            momentum,
            hessian,
        )
        return updates, SophiaHState(state.steps + 1, momentum, hessian, key)

    return optax.GradientTransformationExtraArgs(init, update)
