"""Content checksums: a byte flipped inside array data (same size, still decodes) is named on restore."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
import xxhash

from halyard.train.checkpoint.checksums import file_checksum
from halyard.train.checkpoint.commit_marker import (
    ChecksumMismatchError,
    UnverifiedCheckpointWarning,
    read_commit_marker,
)
from halyard.train.checkpoint.discovery import DamagedCheckpointWarning
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.policies import KeepPolicy
from halyard.train.checkpoint.restore import restore, restore_weights

# Distinct float32 values, so the saved bytes can be found inside the array files.
WEIGHTS = np.linspace(-3.0, 5.0, 64 * 16, dtype=np.float32).reshape(64, 16)
TARGET = {"params": {"w": jax.ShapeDtypeStruct(WEIGHTS.shape, np.float32)}, "step": 0}


def weights_at(step: int) -> np.ndarray:
    return WEIGHTS + np.float32(step)


def save_steps(root: Path, steps: tuple[int, ...] = (1, 2)) -> None:
    with CheckpointManager(root, keep_policy=KeepPolicy(keep_last=5)) as manager:
        for step in steps:
            manager.save(
                step, {"params": {"w": jax.numpy.asarray(weights_at(step))}, "step": step}, wait=True
            )


def flip_a_byte_inside_the_weights(step_dir: Path, step: int) -> Path:
    """Flip the lowest mantissa bit of one stored weight: same size, still decodes, one value differs."""
    needle = weights_at(step).tobytes()[256:320]
    for path in sorted((step_dir / "arrays").rglob("*")):
        if path.is_file() and (offset := path.read_bytes().find(needle)) >= 0:
            with open(path, "r+b") as handle:
                handle.seek(offset + 8)
                original = handle.read(1)[0]
                handle.seek(offset + 8)
                handle.write(bytes([original ^ 0x01]))
            return path
    raise AssertionError(f"the raw weights of step {step} were not found in any file of {step_dir}")


def test_every_file_gets_a_checksum_and_an_untouched_checkpoint_restores_bitwise(tmp_path: Path) -> None:
    save_steps(tmp_path, (1,))
    step_dir = tmp_path / "step_00000001"
    marker = read_commit_marker(step_dir)
    assert set(marker.checksums) == set(marker.files) and len(marker.files) > 1
    for relative, recorded in marker.checksums.items():  # an independent implementation of the checksum
        assert recorded == xxhash.xxh3_64((step_dir / relative).read_bytes()).hexdigest(), relative
    assert json.loads((step_dir / "halyard_checkpoint.json").read_text())["checksum_algorithm"] == "xxh3_64"
    restored = restore(step_dir, TARGET)
    assert np.asarray(restored.state["params"]["w"]).tobytes() == weights_at(1).tobytes()


def test_a_flipped_byte_inside_array_data_is_named_when_that_step_is_restored(tmp_path: Path) -> None:
    save_steps(tmp_path)
    step_dir = tmp_path / "step_00000002"
    recorded = read_commit_marker(step_dir).checksums
    damaged = flip_a_byte_inside_the_weights(step_dir, 2)
    relative = damaged.relative_to(step_dir).as_posix()

    # Without checksums the damage is silent: the file keeps its size and decodes to other weights.
    silent = restore(step_dir, TARGET, verify_checksums=False).state["params"]["w"]
    assert np.sum(np.asarray(silent) != weights_at(2)) == 1

    with pytest.raises(ChecksumMismatchError, match=rf"step 2: file {damaged}.*checksum") as caught:
        restore(step_dir, TARGET)
    assert caught.value.file == damaged and caught.value.step == 2 and caught.value.path == step_dir
    assert caught.value.expected == recorded[relative] != caught.value.actual == file_checksum(damaged)
    assert "verify_checksums=false" in str(caught.value)
    with pytest.raises(ChecksumMismatchError, match=damaged.name):
        restore_weights(step_dir, TARGET["params"], params_path="params")
    # An explicit step fails loudly, it never falls back.
    with CheckpointManager(tmp_path) as manager, pytest.raises(ChecksumMismatchError, match=damaged.name):
        manager.restore(2, TARGET)
    with CheckpointManager(tmp_path, verify_checksums=False) as manager:
        assert manager.restore(2, TARGET).step == 2


def test_resuming_skips_a_damaged_checkpoint_for_the_previous_one(tmp_path: Path) -> None:
    save_steps(tmp_path)
    damaged = flip_a_byte_inside_the_weights(tmp_path / "step_00000002", 2)
    with CheckpointManager(tmp_path) as manager:
        found = rf"checkpoint step 2: .*{damaged.name} failed its xxh3_64 checksum.*fell back to step 1"
        with pytest.warns(DamagedCheckpointWarning, match=found):
            restored = manager.restore(None, TARGET)
        assert restored.step == 1
        assert np.asarray(restored.state["params"]["w"]).tobytes() == weights_at(1).tobytes()
        # The damaged step lost its marker, so a resumed run writes that step again.
        assert manager.complete_steps() == [1]
        assert (tmp_path / "step_00000002" / "halyard_checkpoint.json.unreadable").is_file()


def test_a_file_truncated_then_padded_back_to_its_size_is_found(tmp_path: Path) -> None:
    save_steps(tmp_path, (1,))
    step_dir = tmp_path / "step_00000001"
    largest = max(
        (p for p in (step_dir / "arrays").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    size = largest.stat().st_size
    with open(largest, "r+b") as handle:
        handle.truncate(size // 2)
        handle.truncate(size)  # zeros up to the recorded size: the size check passes
    assert read_commit_marker(step_dir).files[largest.relative_to(step_dir).as_posix()] == size
    with pytest.raises(ChecksumMismatchError, match=largest.name):
        restore(step_dir, TARGET)


def test_checkpoints_saved_before_checksums_restore_with_one_warning(tmp_path: Path) -> None:
    save_steps(tmp_path)
    for step in (1, 2):  # rewrite the markers as the previous version wrote them
        marker_path = tmp_path / f"step_{step:08d}" / "halyard_checkpoint.json"
        content = json.loads(marker_path.read_text())
        del content["checksums"], content["checksum_algorithm"]
        marker_path.write_text(json.dumps(content))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            restored = restore(tmp_path / f"step_{step:08d}", TARGET)
            assert np.asarray(restored.state["params"]["w"]).tobytes() == weights_at(step).tobytes()
    unverified = [w for w in caught if issubclass(w.category, UnverifiedCheckpointWarning)]
    assert len(unverified) == 1 and "without checksums" in str(unverified[0].message)


def test_the_checksum_is_of_the_file_bytes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = np.random.default_rng(0).bytes(9 * 2**20 + 17)  # more than one read buffer
    path.write_bytes(data)
    assert file_checksum(path) == xxhash.xxh3_64(data).hexdigest()
    path.write_bytes(data[:100] + bytes([data[100] ^ 0x80]) + data[101:])
    assert file_checksum(path) != xxhash.xxh3_64(data).hexdigest()
