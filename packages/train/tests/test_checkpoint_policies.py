"""Save and keep policies, alone and driven through the manager with a fake clock."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import pytest

from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy


class FakeClock:
    """Seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_step_policy_is_due_on_multiples_only() -> None:
    policy = SavePolicy(every_steps=5)
    due = [
        step for step in range(1, 21) if policy.is_due(step, now=0.0, last_save_step=None, last_save_time=0.0)
    ]
    assert due == [5, 10, 15, 20]
    assert not policy.is_due(10, now=0.0, last_save_step=10, last_save_time=0.0)


def test_time_policy_counts_from_the_last_save() -> None:
    policy = SavePolicy(every_seconds=60)
    assert not policy.is_due(3, now=59.0, last_save_step=None, last_save_time=0.0)
    assert policy.is_due(3, now=60.0, last_save_step=None, last_save_time=0.0)
    assert not policy.is_due(4, now=100.0, last_save_step=3, last_save_time=60.0)


def test_keep_policy_keeps_the_last_temporaries_and_the_permanent_ones() -> None:
    policy = KeepPolicy(keep_last=2, keep_every_steps=100)
    assert policy.steps_to_delete([50, 100, 150, 200, 250, 260]) == [50, 150]
    # The newest complete checkpoint survives even when it is the only one.
    assert KeepPolicy(keep_last=1).steps_to_delete([7]) == []
    assert KeepPolicy(keep_last=1, keep_every_steps=10).steps_to_delete([5, 10]) == [5]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (lambda: SavePolicy(every_steps=0), "every_steps must be positive"),
        (lambda: SavePolicy(every_seconds=-1), "every_seconds must be positive"),
        (lambda: KeepPolicy(keep_last=0), "keep_last must be >= 1"),
        (lambda: KeepPolicy(keep_every_steps=0), "keep_every_steps must be positive"),
    ],
)
def test_bad_policies_are_refused(policy, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy()


def run(manager: CheckpointManager, clock: FakeClock, steps: range, seconds_per_step: float) -> list[int]:
    saved = []
    for step in steps:
        clock.now += seconds_per_step
        if manager.maybe_save(step, {"w": jnp.full(2, float(step))}):
            saved.append(step)
    manager.wait()
    return saved


def test_time_based_saves_are_temporary_and_pruned(tmp_path: Path) -> None:
    clock = FakeClock()
    with CheckpointManager(
        tmp_path, save_policy=SavePolicy(every_seconds=30), keep_policy=KeepPolicy(keep_last=2), clock=clock
    ) as manager:
        saved = run(manager, clock, range(1, 13), seconds_per_step=10)
        assert saved == [3, 6, 9, 12]
        assert manager.complete_steps() == [9, 12]


def test_step_based_permanent_checkpoints_survive(tmp_path: Path) -> None:
    clock = FakeClock()
    with CheckpointManager(
        tmp_path,
        save_policy=SavePolicy(every_steps=2, every_seconds=1000),
        keep_policy=KeepPolicy(keep_last=1, keep_every_steps=4),
        clock=clock,
    ) as manager:
        saved = run(manager, clock, range(1, 11), seconds_per_step=1)
        assert saved == [2, 4, 6, 8, 10]
        assert manager.complete_steps() == [4, 8, 10]
        # A slow stretch triggers a time-based save between step-based ones.
        clock.now += 5000
        assert manager.maybe_save(11, {"w": jnp.zeros(2)})
        manager.wait()
        assert manager.complete_steps() == [4, 8, 11]


def test_process_zero_decides_and_the_decision_is_broadcast(tmp_path: Path) -> None:
    clock = FakeClock()
    seen: list[bool] = []

    def broadcast_as_if_process_zero_said_yes(decision: bool) -> bool:
        seen.append(decision)
        return True

    # This process is not process 0: its own clock never makes a save due, the broadcast value decides.
    manager = CheckpointManager(
        tmp_path,
        save_policy=SavePolicy(every_seconds=1),
        clock=clock,
        broadcast=broadcast_as_if_process_zero_said_yes,
        process_index=1,
    )
    clock.now += 10
    assert manager.should_save(5)
    assert seen == [False]
    manager.close()


def test_a_resumed_manager_does_not_save_the_resumed_step_again(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, save_policy=SavePolicy(every_steps=5)) as manager:
        manager.save(5, {"w": jnp.ones(2)}, wait=True)
    with CheckpointManager(tmp_path, save_policy=SavePolicy(every_steps=5)) as resumed:
        assert not resumed.should_save(5)
        assert resumed.should_save(10)
