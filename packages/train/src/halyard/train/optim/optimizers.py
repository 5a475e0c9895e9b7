"""The optimizers: a direction (Adam, Lion, Sophia-H, Muon) chained with the same small transformations.

Every optimizer here is

    clip_by_global_norm(max_grad_norm)       # if max_grad_norm is set
    -> direction                             # scale_by_adam / scale_by_lion / scale_by_sophia_h / muon
    -> add_decayed_weights(weight_decay, decay_mask)   # decoupled decay, scaled by the learning rate
    -> scale_by_learning_rate(learning_rate)           # a float or a schedule of the step
    -> scale_by_multipliers(lr_multipliers)            # per-parameter factors (muP), if given

and is an `optax.GradientTransformationExtraArgs`: call
`optimizer.update(grads, state, params, loss_fn=...)`; only Sophia-H uses `loss_fn` (see `sophia.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from halyard.train.optim.multipliers import MultiplierFn, scale_by_multipliers
from halyard.train.optim.muon import muon_labels, scale_by_muon_or_adam
from halyard.train.optim.paths import default_weight_decay_mask
from halyard.train.optim.sophia import scale_by_sophia_h

DecayMask = Callable[[Any], Any] | Any | None
"""A function `params -> tree of bools` (True: decayed), such a tree, or None to decay everything."""


def with_common_steps(
    direction: optax.GradientTransformation,
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    decay_mask: DecayMask = default_weight_decay_mask,
    lr_multipliers: Any | MultiplierFn | None = None,
    max_grad_norm: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Chain clipping, decoupled weight decay, the learning rate and per-parameter multipliers around a direction.

    Args:
        direction: the optimizer's update direction (before the learning rate).
        learning_rate: a float, or a schedule `count -> learning rate`.
        weight_decay: decoupled weight decay coefficient (multiplied by the learning rate, as in AdamW).
        decay_mask: which parameters decay (default: matrices only, see `default_weight_decay_mask`).
        lr_multipliers: per-parameter learning-rate factors (a tree or a `MultiplierFn`), or None.
        max_grad_norm: clip gradients to this global L2 norm first; None disables clipping.

    Raises:
        ValueError: a non-positive `max_grad_norm` or a negative `weight_decay`.
    """
    if max_grad_norm is not None and max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be positive or None (no clipping), got {max_grad_norm}.")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be non-negative, got {weight_decay}.")
    steps: list[optax.GradientTransformation] = []
    if max_grad_norm is not None:
        steps.append(optax.clip_by_global_norm(max_grad_norm))
    steps.append(direction)
    if weight_decay > 0:
        steps.append(optax.add_decayed_weights(weight_decay, mask=decay_mask))
    steps.append(optax.scale_by_learning_rate(learning_rate))
    if lr_multipliers is not None:
        steps.append(scale_by_multipliers(lr_multipliers))
    return optax.chain(*steps)


def adamw(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    **common: Any,
) -> optax.GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter): bias-corrected Adam with decoupled weight decay.

    Args:
        learning_rate: a float or a schedule.
        b1, b2: decay of the first and second moment estimates.
        eps: added to the root of the second moment.
        **common: `weight_decay`, `decay_mask`, `lr_multipliers`, `max_grad_norm` (see `with_common_steps`).
    """
    return with_common_steps(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), learning_rate, **common)


def lion(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.99,
    **common: Any,
) -> optax.GradientTransformationExtraArgs:
    """Lion (Chen et al. 2023): the sign of an interpolated momentum; use a ~3-10x smaller learning rate.

    Args:
        learning_rate: a float or a schedule.
        b1: interpolation between momentum and gradient for the update's sign.
        b2: momentum decay.
        **common: see `with_common_steps`.
    """
    return with_common_steps(optax.scale_by_lion(b1=b1, b2=b2), learning_rate, **common)


def sophia_h(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.965,
    b2: float = 0.99,
    gamma: float = 0.01,
    eps: float = 1e-12,
    clip_threshold: float = 1.0,
    update_interval: int = 10,
    seed: int = 0,
    **common: Any,
) -> optax.GradientTransformationExtraArgs:
    """Sophia-H (Liu et al. 2023); its `update` needs `loss_fn=` (see `halyard.train.optim.sophia`).

    Args:
        learning_rate: a float or a schedule (the per-coordinate update is at most this large).
        b1, b2, gamma, eps, clip_threshold, update_interval, seed: see `scale_by_sophia_h`.
        **common: see `with_common_steps`.
    """
    direction = scale_by_sophia_h(
        b1=b1,
        b2=b2,
        gamma=gamma,
        eps=eps,
        clip_threshold=clip_threshold,
        update_interval=update_interval,
        seed=seed,
    )
    return with_common_steps(direction, learning_rate, **common)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta: float = 0.95,
    ns_steps: int = 5,
    nesterov: bool = True,
    rms_scale: float = 0.2,
    adam_b1: float = 0.9,
    adam_b2: float = 0.95,
    adam_eps: float = 1e-8,
    labels: Any = muon_labels,
    **common: Any,
) -> optax.GradientTransformationExtraArgs:
    """Muon for matrices, Adam for the rest, sharing one learning rate (see `halyard.train.optim.muon`).

    Args:
        learning_rate: a float or a schedule (AdamW-like values work thanks to `rms_scale`).
        beta, ns_steps, nesterov, rms_scale: Muon's settings.
        adam_b1, adam_b2, adam_eps: Adam's settings for non-matrix parameters.
        labels: `params -> tree of "muon" | "adam"` choosing the group of each parameter.
        **common: see `with_common_steps`.
    """
    direction = scale_by_muon_or_adam(
        beta=beta,
        ns_steps=ns_steps,
        nesterov=nesterov,
        rms_scale=rms_scale,
        adam_b1=adam_b1,
        adam_b2=adam_b2,
        adam_eps=adam_eps,
        labels=labels,
    )
    return with_common_steps(direction, learning_rate, **common)
