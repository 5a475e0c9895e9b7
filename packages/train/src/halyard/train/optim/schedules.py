"""Learning-rate schedules: linear warmup, then constant, cosine, linear, or warmup-stable-decay (WSD).

All schedules use the 1-based step number `n = count + 1` (optax passes the 0-based `count` of updates
already applied): warmup rises linearly to the peak, reaching it at `n = warmup_steps`, and every decay
reaches its final value exactly at the last step `n = total_steps`, so no step runs at learning rate 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
import optax

DecayShape = Callable[[jnp.ndarray], jnp.ndarray]
"""Maps decay progress `t` in [0, 1] to the fraction of the way from peak (1) down to the minimum (0)."""

DECAY_SHAPES: dict[str, DecayShape] = {
    "linear": lambda t: 1.0 - t,
    "cosine": lambda t: 0.5 * (1.0 + jnp.cos(jnp.pi * t)),
    "sqrt": lambda t: 1.0 - jnp.sqrt(t),
}
"""Decay curves by name: `linear`, `cosine`, and `sqrt` (the "1 - sqrt" cooldown used with WSD)."""


def _check(peak_learning_rate: float, warmup_steps: int, total_steps: int) -> None:
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}.")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}.")
    if not math.isfinite(peak_learning_rate) or peak_learning_rate < 0:
        raise ValueError(
            f"the learning rate (optimizer.learning_rate) must be a finite number >= 0, got {peak_learning_rate}."
        )


def _warmup_factor(step_number: jnp.ndarray, warmup_steps: int) -> jnp.ndarray:
    if warmup_steps == 0:
        return jnp.ones_like(step_number)
    return jnp.minimum(1.0, step_number / warmup_steps)


def _decay_shape(name: str) -> DecayShape:
    if name not in DECAY_SHAPES:
        raise ValueError(f"unknown decay shape '{name}'; choose one of {', '.join(DECAY_SHAPES)}.")
    return DECAY_SHAPES[name]


def warmup_decay_schedule(
    peak_learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    decay_steps: int | None = None,
    final_learning_rate: float = 0.0,
    shape: str = "cosine",
) -> optax.Schedule:
    """Linear warmup, a stable phase at the peak, then a decay over the last `decay_steps` steps.

    With `decay_steps=None` the decay starts right after warmup (plain warmup + cosine / linear); with
    `decay_steps` smaller than `total_steps - warmup_steps` it is warmup-stable-decay (WSD).

    Args:
        peak_learning_rate: learning rate after warmup.
        total_steps: number of optimizer steps of the run.
        warmup_steps: steps of linear warmup from `peak / warmup_steps` up to the peak (0: none).
        decay_steps: length of the final decay (None: everything after warmup).
        final_learning_rate: learning rate at the last step.
        shape: the decay curve, one of `DECAY_SHAPES` (`linear`, `cosine`, `sqrt`).

    Raises:
        ValueError: negative or inconsistent step counts, or an unknown shape.
    """
    _check(peak_learning_rate, warmup_steps, total_steps)
    decay_shape = _decay_shape(shape)
    if decay_steps is None:
        decay_steps = total_steps - warmup_steps
    if not 0 <= decay_steps <= total_steps - warmup_steps:
        raise ValueError(
            f"decay_steps={decay_steps} must be in [0, total_steps - warmup_steps = {total_steps - warmup_steps}]."
        )
    decay_start = total_steps - decay_steps

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        step_number = jnp.asarray(count, jnp.float32) + 1.0
        progress = jnp.clip((step_number - decay_start) / max(decay_steps, 1), 0.0, 1.0)
        decayed = final_learning_rate + (peak_learning_rate - final_learning_rate) * decay_shape(progress)
        return _warmup_factor(step_number, warmup_steps) * decayed

    return schedule


def warmup_constant_schedule(
    peak_learning_rate: float, total_steps: int, warmup_steps: int = 0
) -> optax.Schedule:
    """Linear warmup to the peak, then constant.

    Args:
        peak_learning_rate: learning rate after warmup.
        total_steps: number of optimizer steps of the run (only checked against `warmup_steps`).
        warmup_steps: steps of linear warmup (0: none).

    Raises:
        ValueError: negative or inconsistent step counts.
    """
    _check(peak_learning_rate, warmup_steps, total_steps)

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        step_number = jnp.asarray(count, jnp.float32) + 1.0
        return _warmup_factor(step_number, warmup_steps) * peak_learning_rate

    return schedule


def steps_from(amount: float, total_steps: int, name: str) -> int:
    """Read a length given as a fraction of the run (< 1) or as a number of steps (>= 1).

    Args:
        amount: `0.1` means 10% of `total_steps`; `200` means 200 steps.
        total_steps: number of optimizer steps of the run.
        name: the config field, for the error message.

    Raises:
        ValueError: a negative amount, or a fractional amount >= 1 that is not a whole number.
    """
    if amount < 0:
        raise ValueError(f"{name} must be non-negative (a fraction < 1 or a number of steps), got {amount}.")
    if amount < 1:
        return round(amount * total_steps)
    if amount != int(amount):
        raise ValueError(f"{name}={amount}: use a fraction below 1 or a whole number of steps.")
    return int(amount)
