"""The optimizers as functions, like optax's aliases: ``adamw(learning_rate, **settings)``.

Every optimizer here is

    clip_by_global_norm(max_grad_norm)       # if max_grad_norm is set
    -> direction                             # scale_by_adam / scale_by_lion / scale_by_sophia_h / muon
    -> add_decayed_weights(weight_decay, decay_mask)   # decoupled decay, scaled by the learning rate
    -> scale_by_learning_rate(learning_rate)           # a float or a schedule of the step
    -> scale_by_multipliers(lr_multipliers)            # per-parameter factors (muP), if given

and is an `optax.GradientTransformationExtraArgs`: call `optimizer.update(grads, state, params, loss_fn=...)`;
only Sophia-H uses `loss_fn` (see `sophia.py`). ``settings`` are the fields of the optimizer's config
(`halyard.train.optim.config`), with the config's defaults: one signature, written once.
"""

from __future__ import annotations

from typing import Any

import optax

from halyard.train.optim.chain import DecayMask
from halyard.train.optim.config import AdamWConfig, LionConfig, MuonConfig, OptimizerConfig, SophiaHConfig
from halyard.train.optim.multipliers import MultiplierFn
from halyard.train.optim.paths import default_weight_decay_mask


def _optimizer(
    config: type[OptimizerConfig],
    learning_rate: optax.ScalarOrSchedule,
    lr_multipliers: Any | MultiplierFn | None,
    decay_mask: DecayMask,
    settings: dict[str, Any],
) -> optax.GradientTransformationExtraArgs:
    if "learning_rate" in settings or "schedule" in settings:
        raise TypeError("pass the learning rate (a float or a schedule) as the first argument")
    return config(**settings).transformation(
        learning_rate, lr_multipliers=lr_multipliers, decay_mask=decay_mask
    )


def adamw(
    learning_rate: optax.ScalarOrSchedule,
    *,
    lr_multipliers: Any | MultiplierFn | None = None,
    decay_mask: DecayMask = default_weight_decay_mask,
    **settings: Any,
) -> optax.GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter) at ``learning_rate`` (a float or a schedule); ``settings``: the fields of
    `AdamWConfig` (``beta1``, ``beta2``, ``epsilon``, ``weight_decay``, ``max_grad_norm``)."""
    return _optimizer(AdamWConfig, learning_rate, lr_multipliers, decay_mask, settings)


def lion(
    learning_rate: optax.ScalarOrSchedule,
    *,
    lr_multipliers: Any | MultiplierFn | None = None,
    decay_mask: DecayMask = default_weight_decay_mask,
    **settings: Any,
) -> optax.GradientTransformationExtraArgs:
    """Lion (Chen et al. 2023) at ``learning_rate``; use a ~3-10x smaller one than AdamW's. ``settings``: the
    fields of `LionConfig`."""
    return _optimizer(LionConfig, learning_rate, lr_multipliers, decay_mask, settings)


def sophia_h(
    learning_rate: optax.ScalarOrSchedule,
    *,
    lr_multipliers: Any | MultiplierFn | None = None,
    decay_mask: DecayMask = default_weight_decay_mask,
    **settings: Any,
) -> optax.GradientTransformationExtraArgs:
    """Sophia-H (Liu et al. 2023) at ``learning_rate``; its `update` needs ``loss_fn=``. ``settings``: the
    fields of `SophiaHConfig`."""
    return _optimizer(SophiaHConfig, learning_rate, lr_multipliers, decay_mask, settings)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    lr_multipliers: Any | MultiplierFn | None = None,
    decay_mask: DecayMask = default_weight_decay_mask,
    **settings: Any,
) -> optax.GradientTransformationExtraArgs:
    """Muon for matrices, Adam for the rest, sharing ``learning_rate`` (see `halyard.train.optim.muon`).
    ``settings``: the fields of `MuonConfig`."""
    return _optimizer(MuonConfig, learning_rate, lr_multipliers, decay_mask, settings)
