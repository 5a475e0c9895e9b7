"""The chain every optimizer here is: clipping, a direction, decoupled weight decay, the learning rate and
per-parameter multipliers (see `with_common_steps`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from halyard.train.optim.multipliers import MultiplierFn, scale_by_multipliers
from halyard.train.optim.paths import default_weight_decay_mask

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
