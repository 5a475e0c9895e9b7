"""kill -9 and SIGTERM of real training processes: every resume ends bitwise equal to an uninterrupted run.

Ten seeded kills in two chains. In the first, each child is killed at a random moment (while starting up,
or a random delay after a new checkpoint folder appears: usually while that asynchronous save is being
written); in the second, the commit marker of the child's second save is held back, so the kill lands
exactly while a checkpoint is half-written. After each kill the newest complete checkpoint must hold the
reference's bits for that step; the next child resumes from it. Each chain then trains to the end.
"""

from __future__ import annotations

import signal
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from reliability_helpers import (
    REFERENCE_STEPS,
    Reference,
    kill_hard,
    output,
    start_training,
    step_directories,
    tiny_config,
    wait_until,
)
from trainer_fixtures import assert_bitwise_equal, load_config

from halyard.train.checkpoint.discovery import latest_complete, scan_checkpoints
from halyard.train.trainer.trainer import Trainer

# The child holds back the commit marker of its second save (the arrays are on disk, the marker is not),
# announcing it in $HALYARD_TEST_SENTINEL, so the parent kills it in the middle of that write.
STALL_SECOND_COMMIT = """
import os, pathlib, time
import halyard.train.checkpoint.manager as manager_module
real_write = manager_module.write_commit_marker
saves = []
def held_back_write(step_dir, step, *args, **kwargs):
    saves.append(step)
    if len(saves) == 2:
        pathlib.Path(os.environ["HALYARD_TEST_SENTINEL"]).write_text(str(step))
        time.sleep(30)
    return real_write(step_dir, step, *args, **kwargs)
manager_module.write_commit_marker = held_back_write
"""


def latest_without_warnings(run_dir: Path) -> int | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return latest_complete(run_dir / "checkpoints")


def check_checkpoint_matches_reference(config: Path, run_dir: Path, reference: Reference) -> int | None:
    step = latest_without_warnings(run_dir)
    if step is not None:
        restored = Trainer(load_config(config)).restore_state(step)
        assert int(restored.step) == step
        assert_bitwise_equal(reference.params_at(step), restored.params)
    return step


def finish_and_compare(config: Path, reference: Reference) -> None:
    result = Trainer(load_config(config)).fit()
    assert int(result.state.step) == REFERENCE_STEPS
    assert_bitwise_equal(reference.final.state.params, result.state.params)
    assert_bitwise_equal(reference.final.state.opt_state, result.state.opt_state)


def test_kill9_at_random_moments_resumes_to_the_reference_bits(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    rng = np.random.default_rng(2026)
    kills, chain = 0, 0
    while kills < 7:
        chain += 1
        config = tiny_config(tmp_path, f"chain{chain}", shared_cache)
        run_dir = tmp_path / f"chain{chain}"
        for attempt in range(REFERENCE_STEPS + 2):
            log = tmp_path / f"chain{chain}-{attempt}.log"
            child = start_training(config, log)
            if rng.random() < 0.25:  # anywhere in start-up: imports, data, restore, compile
                time.sleep(float(rng.uniform(0.5, 6.0)))
            else:
                before = set(step_directories(run_dir))
                wait_until(lambda d=run_dir, b=before: bool(set(step_directories(d)) - b), child)
                time.sleep(float(rng.uniform(0.0, 0.25)))
            status = kill_hard(child)
            if status == 0:  # the run finished before the kill landed: check it and start another chain
                assert latest_without_warnings(run_dir) == REFERENCE_STEPS
                break
            assert status == -signal.SIGKILL, output(log)[-3000:]
            kills += 1
            check_checkpoint_matches_reference(config, run_dir, reference)
            if kills >= 7:
                break
        finish_and_compare(config, reference)


def test_kill9_while_a_checkpoint_is_half_written_resumes_to_the_reference_bits(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    config = tiny_config(tmp_path, "stalled", shared_cache)
    run_dir = tmp_path / "stalled"
    rng = np.random.default_rng(9)
    for trial in range(3):
        sentinel = tmp_path / f"sentinel-{trial}"
        log = tmp_path / f"stalled-{trial}.log"
        child = start_training(
            config, log, setup=STALL_SECOND_COMMIT, env={"HALYARD_TEST_SENTINEL": str(sentinel)}
        )
        assert wait_until(sentinel.exists, child), output(log)[-3000:]
        time.sleep(float(rng.uniform(0.0, 0.5)))
        assert kill_hard(child) == -signal.SIGKILL
        half_written = int(sentinel.read_text())
        scan = scan_checkpoints(run_dir / "checkpoints", warn=False)
        assert half_written in scan.damaged and "commit marker" in scan.damaged[half_written].reason
        # The previous save is complete and holds the reference's bits; the half-written one is skipped.
        assert check_checkpoint_matches_reference(config, run_dir, reference) == half_written - 1
    finish_and_compare(config, reference)


def test_sigterm_saves_and_exits_143_within_a_bounded_time(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    config = tiny_config(tmp_path, "term", shared_cache, checkpoint={"every_steps": None})
    run_dir = tmp_path / "term"
    log = tmp_path / "term.log"
    child = start_training(config, log)
    metrics = run_dir / "metrics.jsonl"
    assert wait_until(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, child)
    child.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        # the bound: one step plus one synchronous save, with room for a loaded 2-core machine (the checkpoint
        # below, before REFERENCE_STEPS, shows the run stopped early rather than trained to its end)
        status = child.wait(timeout=300)
    except Exception:
        kill_hard(child)
        pytest.fail(f"no exit within 300 s of SIGTERM:\n{output(log)[-3000:]}")
    assert status == 143, output(log)[-3000:]
    assert time.monotonic() - signalled < 300
    saved = check_checkpoint_matches_reference(config, run_dir, reference)
    assert saved is not None and 2 <= saved < REFERENCE_STEPS
    assert metrics.read_text().count("\n") == saved  # the checkpoint holds the last step it logged
    finish_and_compare(config, reference)
