"""Schedule configs, chosen by `type:` (constant | cosine | linear | wsd), each with `build(...)`."""

from __future__ import annotations

from dataclasses import dataclass

import optax

from halyard.train.config.choices import choice_section, register
from halyard.train.optim.schedules import steps_from, warmup_constant_schedule, warmup_decay_schedule


@choice_section
@dataclass(frozen=True)
class ScheduleConfig:
    """How the learning rate moves over the run (`type:` selects the shape)."""

    warmup: float = 0.01
    """Linear warmup length: a fraction of the run when below 1 (0.01 = 1%), else a number of steps."""

    def build(self, peak_learning_rate: float, total_steps: int) -> optax.Schedule:
        """The schedule `count -> learning rate` for a run of `total_steps` optimizer steps.

        Args:
            peak_learning_rate: the learning rate after warmup.
            total_steps: number of optimizer steps in the run.

        Raises:
            ValueError: lengths that do not fit in `total_steps`.
        """
        raise TypeError(f"{type(self).__name__} is the base class; pick a schedule with `type:`.")

    def warmup_steps(self, total_steps: int) -> int:
        """The warmup length in steps for a run of `total_steps`."""
        return steps_from(self.warmup, total_steps, "schedule.warmup")


@register(ScheduleConfig, "constant")
@dataclass(frozen=True)
class ConstantScheduleConfig(ScheduleConfig):
    """Warmup, then the peak learning rate until the end."""

    def build(self, peak_learning_rate: float, total_steps: int) -> optax.Schedule:
        return warmup_constant_schedule(peak_learning_rate, total_steps, self.warmup_steps(total_steps))


@register(ScheduleConfig, "cosine")
@dataclass(frozen=True)
class CosineScheduleConfig(ScheduleConfig):
    """Warmup, then a cosine decay to `min_lr_ratio * peak` at the last step."""

    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""

    def build(self, peak_learning_rate: float, total_steps: int) -> optax.Schedule:
        return warmup_decay_schedule(
            peak_learning_rate,
            total_steps,
            self.warmup_steps(total_steps),
            final_learning_rate=self.min_lr_ratio * peak_learning_rate,
            shape="cosine",
        )


@register(ScheduleConfig, "linear")
@dataclass(frozen=True)
class LinearScheduleConfig(ScheduleConfig):
    """Warmup, then a linear decay to `min_lr_ratio * peak` at the last step."""

    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of the peak."""

    def build(self, peak_learning_rate: float, total_steps: int) -> optax.Schedule:
        return warmup_decay_schedule(
            peak_learning_rate,
            total_steps,
            self.warmup_steps(total_steps),
            final_learning_rate=self.min_lr_ratio * peak_learning_rate,
            shape="linear",
        )


@register(ScheduleConfig, "wsd")
@dataclass(frozen=True)
class WSDScheduleConfig(ScheduleConfig):
    """Warmup-stable-decay: warmup, hold the peak, then decay over the final `decay` part of the run."""

    decay: float = 0.2
    """Decay length: a fraction of the run when below 1, else a number of steps."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of the peak."""
    decay_shape: str = "linear"
    """Shape of the decay: linear | cosine | sqrt (1 - sqrt, the usual WSD cooldown)."""

    def build(self, peak_learning_rate: float, total_steps: int) -> optax.Schedule:
        return warmup_decay_schedule(
            peak_learning_rate,
            total_steps,
            self.warmup_steps(total_steps),
            decay_steps=steps_from(self.decay, total_steps, "schedule.decay"),
            final_learning_rate=self.min_lr_ratio * peak_learning_rate,
            shape=self.decay_shape,
        )
