"""Schedules against independent numpy formulas; schedule configs; bad lengths are refused."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from float_tolerance import SCHEDULE_TERMS, summation_tolerance

from halyard.train.config.errors import ConfigError
from halyard.train.config.parse import parse_config
from halyard.train.optim.config import OptimizerConfig
from halyard.train.optim.schedule_config import (
    ConstantScheduleConfig,
    CosineScheduleConfig,
    LinearScheduleConfig,
    WSDScheduleConfig,
)
from halyard.train.optim.schedules import warmup_decay_schedule

PEAK, TOTAL = 2.0, 20
# float32 schedules against float64 formulas: SCHEDULE_TERMS roundings at the peak's size (rtol=1e-6 with
# atol=1e-7 was below that bound: pi times the progress alone rounds by up to 4 eps at pi)
TOLERANCE = summation_tolerance(PEAK, SCHEDULE_TERMS)


def values(schedule) -> np.ndarray:
    return np.asarray(jax.vmap(schedule)(np.arange(TOTAL)))


def reference(step: int, warmup: int, decay_start: int, final: float, shape: str) -> float:
    """Learning rate before update `step` (0-based), written from the textbook definitions."""
    n = step + 1
    if n <= warmup:
        return PEAK * n / warmup
    if n <= decay_start:
        return PEAK
    t = (n - decay_start) / (TOTAL - decay_start)
    fraction = {"linear": 1 - t, "cosine": (1 + math.cos(math.pi * t)) / 2, "sqrt": 1 - math.sqrt(t)}[shape]
    return final + (PEAK - final) * fraction


@pytest.mark.parametrize(
    ("config", "warmup", "decay_start", "final", "shape"),
    [
        (CosineScheduleConfig(warmup=4, min_lr_ratio=0.1), 4, 4, 0.2, "cosine"),
        (CosineScheduleConfig(warmup=0.25, min_lr_ratio=0.0), 5, 5, 0.0, "cosine"),
        (LinearScheduleConfig(warmup=0), 0, 0, 0.0, "linear"),
        (WSDScheduleConfig(warmup=2, decay=0.25, min_lr_ratio=0.05), 2, 15, 0.1, "linear"),
        (WSDScheduleConfig(warmup=0.1, decay=6, decay_shape="sqrt"), 2, 14, 0.0, "sqrt"),
        (WSDScheduleConfig(warmup=3, decay=4, decay_shape="cosine"), 3, 16, 0.0, "cosine"),
        (ConstantScheduleConfig(warmup=5), 5, TOTAL, 0.0, "linear"),
    ],
)
def test_schedules_match_reference(config, warmup, decay_start, final, shape):
    got = values(config.build(PEAK, TOTAL))
    expected = [reference(step, warmup, decay_start, final, shape) for step in range(TOTAL)]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


def test_no_step_runs_at_zero_and_the_last_step_reaches_the_final_value():
    got = values(CosineScheduleConfig(warmup=3, min_lr_ratio=0.1).build(PEAK, TOTAL))
    assert got[0] == pytest.approx(PEAK / 3, abs=TOLERANCE, rel=0)
    assert got[2] == pytest.approx(PEAK, abs=TOLERANCE, rel=0)
    assert got[-1] == pytest.approx(0.1 * PEAK, abs=TOLERANCE, rel=0)


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="decay_steps=30"):
        WSDScheduleConfig(warmup=0, decay=30).build(PEAK, TOTAL)
    with pytest.raises(ValueError, match="warmup_steps"):
        CosineScheduleConfig(warmup=25).build(PEAK, TOTAL)
    with pytest.raises(ValueError, match="schedule.warmup"):
        CosineScheduleConfig(warmup=2.5).build(PEAK, TOTAL)
    with pytest.raises(ValueError, match="unknown decay shape 'cubic'"):
        warmup_decay_schedule(PEAK, TOTAL, shape="cubic")


def test_optimizer_and_schedule_choices_from_the_command_line():
    config = parse_config(
        OptimizerConfig,
        ["--type", "lion", "--learning_rate", "1e-4", "--schedule.type", "wsd", "--schedule.decay", "0.3"],
    )
    assert config.schedule == WSDScheduleConfig(decay=0.3)
    assert config.learning_rate == 1e-4  # the string "1e-4" parsed: the same float
    assert type(config).__name__ == "LionConfig"
    with pytest.raises(ConfigError, match="Did you mean 'sophia_h'"):
        parse_config(OptimizerConfig, ["--type", "sophia"])
