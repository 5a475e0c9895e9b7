"""A run derives each value once (`RunSetup`), and the learning rate it logs is the one its update applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import summation_tolerance
from trainer_fixtures import load_config, write_config

import halyard.train.run.setup as run_setup
from halyard.train.optim.config import AdamWConfig, OptimizerConfig
from halyard.train.optim.schedule_config import LinearScheduleConfig
from halyard.train.step import TrainState, init_state, make_train_step
from halyard.train.trainer.trainer import Trainer


def test_a_run_builds_its_schedule_and_abstract_state_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedules, abstract_states = [], []
    build_schedule = OptimizerConfig.learning_rate_schedule
    eval_shape = jax.eval_shape

    def counted_schedule(self: Any, total_steps: int) -> Any:
        schedules.append(total_steps)
        return build_schedule(self, total_steps)

    def counted_eval_shape(fn: Any, *args: Any, **kwargs: Any) -> Any:
        shapes = eval_shape(fn, *args, **kwargs)
        if isinstance(shapes, TrainState):
            abstract_states.append(shapes)
        return shapes

    monkeypatch.setattr(OptimizerConfig, "learning_rate_schedule", counted_schedule)
    monkeypatch.setattr(run_setup.jax, "eval_shape", counted_eval_shape)
    config = load_config(write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache"))
    result = Trainer(config).fit()
    assert int(result.state.step) == config.trainer.steps > 1
    assert schedules == [config.trainer.steps]  # preflight, optimizer, step and log share it
    assert len(abstract_states) == 1  # preflight's check, the initial state and the step's shardings


def test_the_logged_learning_rate_is_the_applied_one_after_a_skipped_step() -> None:
    """AdamW at 1.0 with a linear decay over 10 steps, a NaN batch at step 2: the skipped update keeps the
    optimizer's count, so from step 3 on the schedule is read one count behind the step; the logged rate
    must be that one. With a constant gradient of ones, Adam's direction is 1 for every coordinate, so the
    rate an update applied is the fall of the weights."""
    config = AdamWConfig(
        learning_rate=1.0, weight_decay=0.0, max_grad_norm=None, schedule=LinearScheduleConfig(warmup=0.0)
    )
    schedule = config.learning_rate_schedule(10)
    optimizer = config.build(schedule=schedule)

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> Any:
        loss = jnp.sum(params["w"] * batch["x"])
        return jnp.where(batch["bad"] > 0, jnp.nan, loss), {"num_tokens": jnp.ones(())}

    step = jax.jit(make_train_step(loss_fn, optimizer, learning_rate=schedule))
    state = init_state({"w": jnp.zeros(4)}, optimizer, jax.random.PRNGKey(0))
    logged, applied = [], []
    for number in range(1, 6):
        before = np.asarray(state.params["w"])
        batch = {"x": jnp.ones(4), "bad": jnp.asarray(int(number == 2))}
        state, metrics = step(state, batch)
        if not int(metrics["nonfinite"]):
            logged.append(float(metrics["learning_rate"]))
            applied.append(float((before - np.asarray(state.params["w"])).mean()))
    assert int(state.step) == 5 and int(state.nonfinite_steps) == 1
    # Adam's direction for a gradient of 1 is 1 to its ~10 roundings (the moments, the bias corrections, the
    # square root, epsilon, the quotient), times the rate; the weights' subtraction rounds at their size
    bound = summation_tolerance(max(logged), 10) + summation_tolerance(np.asarray(state.params["w"]), 1)
    np.testing.assert_allclose(logged, applied, atol=bound, rtol=0)
    # Read at the step count instead, steps 3 to 5 would log the next rates down the schedule.
    assert logged[1:] != pytest.approx([float(schedule(s)) for s in (2, 3, 4)])
