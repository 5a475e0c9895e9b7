"""Optimizer configs, chosen by `type:` (adamw | lion | sophia_h | muon): each one's fields ARE its signature.

    optimizer:
      type: adamw
      learning_rate: 3e-4
      weight_decay: 0.1
      schedule: {type: wsd, warmup: 0.01, decay: 0.2}

A hyperparameter is written once, as a field with its default and meaning: the YAML key, the keyword of the
Python functions (`halyard.train.optim.optimizers.adamw(1e-3, beta2=0.99)`) and the keyword of the direction
it configures (`scale_by_sophia_h(beta1=...)`) are that field's name. `config.build(total_steps)` returns an
`optax.GradientTransformationExtraArgs`; the trainer calls `update(grads, state, params, loss_fn=...)` (only
Sophia-H uses `loss_fn`, the others ignore it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import optax

from halyard.train.config.choices import choice_section, register
from halyard.train.optim.chain import DecayMask, with_common_steps
from halyard.train.optim.multipliers import MultiplierFn
from halyard.train.optim.muon import scale_by_muon_or_adam
from halyard.train.optim.paths import default_weight_decay_mask
from halyard.train.optim.schedule_config import CosineScheduleConfig, ScheduleConfig
from halyard.train.optim.sophia import scale_by_sophia_h


@choice_section
@dataclass(frozen=True)
class OptimizerConfig:
    """Settings shared by every optimizer (`type:` selects the algorithm)."""

    learning_rate: float = 3e-4
    """Peak learning rate (reached after warmup)."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices only (not norms, biases, embeddings)."""
    max_grad_norm: float | None = 1.0
    """Clip gradients to this global L2 norm; null disables clipping."""
    schedule: ScheduleConfig = field(default_factory=CosineScheduleConfig)
    """Learning-rate schedule (`type:` constant | cosine | linear | wsd)."""

    elementwise: ClassVar[bool] = False
    """Each element's update depends on that element's gradient and state alone (and global norms): computing
    the update a second time costs a read of the state, no matrix product (the trainer then checks the update's
    norm before writing the state, in place: `make_train_step`'s ``check_update_first``)."""

    def learning_rate_schedule(self, total_steps: int) -> optax.Schedule:
        """The learning rate as a function of the update count, for a run of `total_steps` steps."""
        return self.schedule.build(self.learning_rate, total_steps)

    def build(
        self,
        total_steps: int | None = None,
        *,
        schedule: optax.Schedule | None = None,
        lr_multipliers: Any | MultiplierFn | None = None,
        decay_mask: DecayMask = default_weight_decay_mask,
    ) -> optax.GradientTransformationExtraArgs:
        """The optax optimizer for a run of `total_steps` optimizer steps (or on a schedule built already).

        Args:
            total_steps: number of optimizer steps (the schedule's length); give this or ``schedule``.
            schedule: the run's `learning_rate_schedule`, when the caller built it already.
            lr_multipliers: per-parameter learning-rate factors (muP), a tree or `fn(path, param)`.
            decay_mask: which parameters decay (default `default_weight_decay_mask`; None: all).

        Raises:
            ValueError: inconsistent schedule lengths or out-of-range settings.
        """
        if (total_steps is None) == (schedule is None):
            raise TypeError("give exactly one of total_steps and schedule")
        if schedule is None:
            assert total_steps is not None
            schedule = self.learning_rate_schedule(total_steps)
        return self.transformation(schedule, lr_multipliers=lr_multipliers, decay_mask=decay_mask)

    def transformation(
        self,
        learning_rate: optax.ScalarOrSchedule,
        *,
        lr_multipliers: Any | MultiplierFn | None = None,
        decay_mask: DecayMask = default_weight_decay_mask,
    ) -> optax.GradientTransformationExtraArgs:
        """This optimizer at ``learning_rate`` (a float or a schedule; ``self.learning_rate`` and
        ``self.schedule`` are not read): clipping, the direction, weight decay, the rate, the multipliers."""
        return with_common_steps(
            self.direction(),
            learning_rate,
            weight_decay=self.weight_decay,
            decay_mask=decay_mask,
            lr_multipliers=lr_multipliers,
            max_grad_norm=self.max_grad_norm,
        )

    def direction(self) -> optax.GradientTransformation:
        """The update direction before the learning rate, from this type's own fields."""
        raise TypeError(f"{type(self).__name__} is the base class; pick an optimizer with `type:`.")

    def own_settings(self) -> dict[str, Any]:
        """This type's own fields (those the shared base does not have), by name."""
        shared = {f.name for f in dataclasses.fields(OptimizerConfig)}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in shared}


@register(OptimizerConfig, "adamw")
@dataclass(frozen=True)
class AdamWConfig(OptimizerConfig):
    """AdamW."""

    elementwise: ClassVar[bool] = True

    beta1: float = 0.9
    """Decay of the first moment (momentum)."""
    beta2: float = 0.95
    """Decay of the second moment."""
    epsilon: float = 1e-8
    """Added to the root of the second moment."""

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon)


@register(OptimizerConfig, "lion")
@dataclass(frozen=True)
class LionConfig(OptimizerConfig):
    """Lion: sign of interpolated momentum (use a 3-10x smaller learning rate and larger decay than AdamW)."""

    elementwise: ClassVar[bool] = True

    beta1: float = 0.9
    """Interpolation between momentum and gradient for the update's sign."""
    beta2: float = 0.99
    """Decay of the momentum."""

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_lion(b1=self.beta1, b2=self.beta2)


@register(OptimizerConfig, "sophia_h")
@dataclass(frozen=True)
class SophiaHConfig(OptimizerConfig):
    """Sophia-H: momentum over a Hutchinson diagonal-Hessian estimate, clipped per coordinate."""

    beta1: float = 0.965
    """Decay of the momentum."""
    beta2: float = 0.99
    """Decay of the Hessian estimate's running average (one decay per refresh)."""
    gamma: float = 0.01
    """Hessian scale in the denominator (the paper's rho): larger is more conservative."""
    epsilon: float = 1e-12
    """Floor of the denominator."""
    clip_threshold: float = 1.0
    """Per-coordinate bound of the update before the learning rate."""
    update_interval: int = 10
    """Refresh the Hessian estimate every this many steps (one extra Hessian-vector product)."""
    seed: int = 0
    """Seed of the estimator's random signs."""

    def direction(self) -> optax.GradientTransformation:
        return scale_by_sophia_h(**self.own_settings())


@register(OptimizerConfig, "muon")
@dataclass(frozen=True)
class MuonConfig(OptimizerConfig):
    """Muon for weight matrices (Newton-Schulz orthogonalised momentum), AdamW for the other parameters."""

    beta: float = 0.95
    """Muon momentum decay."""
    ns_steps: int = 5
    """Newton-Schulz iterations."""
    nesterov: bool = True
    """Use Nesterov momentum for Muon."""
    rms_scale: float = 0.2
    """Muon update RMS relative to AdamW's (0.2 lets both groups share one learning rate)."""
    adam_beta1: float = 0.9
    """AdamW first-moment decay for non-matrix parameters."""
    adam_beta2: float = 0.95
    """AdamW second-moment decay for non-matrix parameters."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon for non-matrix parameters."""

    def direction(self) -> optax.GradientTransformation:
        return scale_by_muon_or_adam(**self.own_settings())
