"""Finding the latest complete checkpoint: incomplete and damaged directories are skipped, with a warning."""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import halyard.train.checkpoint.manager as manager_module
from halyard.train.checkpoint.commit_marker import DamagedCheckpointError, read_commit_marker
from halyard.train.checkpoint.discovery import (
    DamagedCheckpointWarning,
    latest_complete,
    resolve_checkpoint,
    scan_checkpoints,
)
from halyard.train.checkpoint.manager import CheckpointManager, CheckpointWriteError
from halyard.train.checkpoint.policies import KeepPolicy
from halyard.train.checkpoint.restore import restore

TARGET = {"w": jax.ShapeDtypeStruct((64,), jnp.float32)}


def state(step: int) -> dict:
    return {"w": jnp.arange(64, dtype=jnp.float32) + step}


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> Path:
    with CheckpointManager(tmp_path, keep_policy=KeepPolicy(keep_last=5)) as manager:
        manager.save(1, state(1), wait=True)
        manager.save(2, state(2), wait=True)
    return tmp_path


def test_latest_complete_of_an_empty_or_missing_root_is_none(tmp_path: Path) -> None:
    assert latest_complete(tmp_path) is None
    assert latest_complete(tmp_path / "missing") is None


def test_latest_complete_finds_the_newest(two_checkpoints: Path) -> None:
    assert latest_complete(two_checkpoints) == 2
    marker = read_commit_marker(two_checkpoints / "step_00000002")
    assert marker.step == 2 and marker.files and all(size >= 0 for size in marker.files.values())


def test_a_directory_without_marker_is_skipped_with_its_path(two_checkpoints: Path) -> None:
    (two_checkpoints / "step_00000002" / "halyard_checkpoint.json").unlink()
    with pytest.warns(DamagedCheckpointWarning, match=r"step_00000002.*no commit marker"):
        assert latest_complete(two_checkpoints) == 1


def test_an_empty_directory_named_like_a_checkpoint_is_skipped(two_checkpoints: Path) -> None:
    (two_checkpoints / "step_00000009").mkdir()
    (two_checkpoints / "notes").mkdir()  # not named like a checkpoint: ignored silently
    with pytest.warns(DamagedCheckpointWarning, match=r"step_00000009.*no commit marker"):
        assert latest_complete(two_checkpoints) == 2


def test_a_garbage_marker_is_skipped(two_checkpoints: Path) -> None:
    (two_checkpoints / "step_00000002" / "halyard_checkpoint.json").write_text('{"format": "halyard-chec')
    with pytest.warns(DamagedCheckpointWarning, match=r"step_00000002.*unreadable commit marker"):
        assert latest_complete(two_checkpoints) == 1


def test_a_truncated_array_file_is_detected_and_the_previous_checkpoint_used(two_checkpoints: Path) -> None:
    step_dir = two_checkpoints / "step_00000002"
    data_files = [path for path in (step_dir / "arrays").rglob("*") if path.is_file()]
    largest = max(data_files, key=lambda path: path.stat().st_size)
    size = largest.stat().st_size
    with open(largest, "r+b") as handle:
        handle.truncate(size // 2)
    with pytest.warns(
        DamagedCheckpointWarning, match=rf"{largest.name} has {size // 2} bytes.*recorded {size}"
    ):
        step = latest_complete(two_checkpoints)
    assert step == 1
    with pytest.raises(DamagedCheckpointError, match="truncated"):
        restore(step_dir, TARGET)
    restored = restore(two_checkpoints / "step_00000001", TARGET)
    assert np.array_equal(np.asarray(restored.state["w"]), np.asarray(state(1)["w"]))
    scan = scan_checkpoints(two_checkpoints, warn=False)
    assert list(scan.complete) == [1] and list(scan.damaged) == [2]


def test_save_returns_while_the_write_is_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    real_writer = manager_module.write_commit_marker

    def slow_commit(*args, **kwargs):
        entered.set()
        assert release.wait(timeout=60)
        return real_writer(*args, **kwargs)

    with CheckpointManager(tmp_path, keep_policy=KeepPolicy(keep_last=1)) as manager:
        manager.save(1, state(1), wait=True)
        monkeypatch.setattr(manager_module, "write_commit_marker", slow_commit)
        assert manager.save(2, state(2))
        # Training would continue here: the save is observable as in flight and not yet complete.
        assert manager.in_progress_step == 2
        # The arrays of step 2 are on disk once the writer reaches its commit marker (on a loaded machine
        # the scan below could otherwise run before the step's folder exists).
        assert entered.wait(timeout=60)
        with pytest.warns(DamagedCheckpointWarning, match="step_00000002"):
            assert latest_complete(tmp_path) == 1
        assert (tmp_path / "step_00000001").exists()  # nothing is deleted before the new one is durable
        release.set()
        manager.wait()
        assert manager.in_progress_step is None
        assert latest_complete(tmp_path) == 2
        assert manager.complete_steps() == [2]
        assert not (tmp_path / "step_00000001").exists()


def test_a_failed_background_write_is_raised_and_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_commit(*args, **kwargs):
        raise OSError("No space left on device")

    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state(1), wait=True)
        monkeypatch.setattr(manager_module, "write_commit_marker", failing_commit)
        manager.save(2, state(2))
        with pytest.raises(CheckpointWriteError, match="No space left"):
            manager.wait()
        monkeypatch.undo()
        with pytest.warns(DamagedCheckpointWarning):
            assert manager.latest_step() == 1
        # The next save replaces the incomplete directory of the failed one.
        with pytest.warns(
            DamagedCheckpointWarning, match="step 2: replacing the incomplete checkpoint .*interrupted"
        ):
            manager.save(2, state(2), wait=True)
        assert manager.latest_step() == 2


def test_resolve_checkpoint_accepts_a_step_a_root_or_a_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with CheckpointManager(run_dir / "checkpoints") as manager:
        manager.save(1, state(1), wait=True)
        manager.save(2, state(2), wait=True)
    step_2 = run_dir / "checkpoints" / "step_00000002"
    assert resolve_checkpoint(step_2) == step_2
    assert resolve_checkpoint(run_dir / "checkpoints") == step_2
    assert resolve_checkpoint(run_dir) == step_2
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="No complete checkpoint"):
        resolve_checkpoint(run_dir / "checkpoints" / "step_00000002" / "arrays")  # exists, holds no steps
    (step_2 / "halyard_checkpoint.json").unlink()
    with pytest.raises(DamagedCheckpointError, match="no commit marker"):
        resolve_checkpoint(step_2)
