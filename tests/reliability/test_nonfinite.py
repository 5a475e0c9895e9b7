"""A NaN loss injected at one step: ``trainer.nonfinite=skip`` skips and counts it, ``stop`` stops.

Token ids cannot carry a NaN, so the loss function is wrapped in-process to return NaN at one step (the
injection is traced into the compiled step, exactly where a real overflow would appear).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from reliability_helpers import Reference, tiny_config
from trainer_fixtures import assert_bitwise_equal, leaves, load_config

import halyard.train.run.setup as run_setup
from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.trainer.trainer import NonFiniteLossError, Trainer

BAD_STEP = 5  # the 5th step (state.step == 4 when it starts) gets a NaN loss


def poison_loss_at(monkeypatch: pytest.MonkeyPatch, bad_step: int) -> None:
    """Make the loss NaN during training step ``bad_step`` (1-based) of every Trainer in this test."""
    current: dict[str, Any] = {}
    real_loss_fn, real_make_train_step = run_setup.objective_loss_fn, run_setup.make_train_step

    def poisoned_loss_fn(*args: Any, **kwargs: Any) -> Any:
        loss_fn = real_loss_fn(*args, **kwargs)

        def loss(params: Any, batch: Any, key: Any) -> Any:
            loss_sum, stats = loss_fn(params, batch, key)
            return loss_sum * jnp.where(current["step"] == bad_step - 1, jnp.nan, 1.0), stats

        return loss

    def make_train_step(*args: Any, **kwargs: Any) -> Any:
        step_fn = real_make_train_step(*args, **kwargs)

        def train_step(state: Any, batch: Any, frozen: Any = None) -> Any:
            current["step"] = state.step  # a tracer of this step's trace, read by the loss above
            return step_fn(state, batch, frozen)

        return train_step

    monkeypatch.setattr(run_setup, "objective_loss_fn", poisoned_loss_fn)
    monkeypatch.setattr(run_setup, "make_train_step", make_train_step)


def test_skip_keeps_the_weights_and_counts_the_step(
    tmp_path: Path, shared_cache: Path, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_loss_at(monkeypatch, BAD_STEP)
    config = tiny_config(tmp_path, "skip", shared_cache, trainer={"nonfinite": "skip"})
    result = Trainer(load_config(config)).fit()
    assert int(result.state.step) == 8 and int(result.state.nonfinite_steps) == 1
    flags = {int(row["step"]): row["nonfinite"] for row in result.history}
    assert flags[BAD_STEP] == 1 and sum(flags.values()) == 1
    assert np.isnan(next(row["loss"] for row in result.history if row["step"] == BAD_STEP))
    trainer = Trainer(load_config(config))
    # The skipped step left the weights as they were; the steps before it match the reference.
    assert_bitwise_equal(trainer.restore_state(BAD_STEP - 1).params, trainer.restore_state(BAD_STEP).params)
    assert_bitwise_equal(reference.params_at(BAD_STEP - 1), trainer.restore_state(BAD_STEP - 1).params)
    for leaf in leaves(result.state.params):
        assert np.isfinite(leaf).all()


def test_stop_raises_with_a_message_and_leaves_the_checkpoint_from_before(
    tmp_path: Path, shared_cache: Path, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_loss_at(monkeypatch, BAD_STEP)
    config = tiny_config(tmp_path, "stop", shared_cache, trainer={"nonfinite": "stop"})
    with pytest.raises(NonFiniteLossError, match="not finite at step") as stopped:
        Trainer(load_config(config)).fit()
    assert "trainer.nonfinite=stop" in str(stopped.value)
    assert latest_complete(tmp_path / "stop" / "checkpoints") == BAD_STEP - 1
    restored = Trainer(load_config(config)).restore_state()
    assert_bitwise_equal(reference.params_at(BAD_STEP - 1), restored.params)


def test_skip_gives_up_after_max_nonfinite_steps(
    tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_loss_at(monkeypatch, BAD_STEP)
    config = tiny_config(
        tmp_path, "limit", shared_cache, trainer={"nonfinite": "skip", "max_nonfinite_steps": 0}
    )
    with pytest.raises(NonFiniteLossError, match="max_nonfinite_steps=0"):
        Trainer(load_config(config)).fit()
