"""Damaged checkpoints are detected, reported with their path, and the run resumes from the previous one.

The newest checkpoints of a copy of the reference run are damaged the ways disks and crashes damage
them; the `train` command then resumes from the newest checkpoint left that reads back as written, names
each damaged folder on stderr, writes the damaged steps again and ends with the reference's bits.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reliability_helpers import REFERENCE_STEPS, Reference, output, start_training, tiny_config
from trainer_fixtures import assert_bitwise_equal, load_config

from halyard.train.checkpoint.discovery import latest_complete
from halyard.train.trainer.trainer import Trainer


def largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def copy_reference(reference: Reference, tmp_path: Path, shared_cache: Path, name: str) -> tuple[Path, Path]:
    config = tiny_config(tmp_path, name, shared_cache)
    run_dir = tmp_path / name
    shutil.copytree(
        load_config(reference.config_path).trainer.run_dir + "/checkpoints", run_dir / "checkpoints"
    )
    return config, run_dir


def test_damaged_checkpoints_are_reported_and_skipped(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    """Steps 5 to 8 damaged so that the scan skips them; step 4 garbled in place (same size, other bytes: the
    commit marker's sizes cannot see it, reading the arrays does), so the restore falls back to step 3. One
    `train` resume meets both: the newest complete checkpoint, then the one before it."""
    config, run_dir = copy_reference(reference, tmp_path, shared_cache, "damaged")
    root = run_dir / "checkpoints"
    damaged = {step: root / f"step_{step:08d}" for step in (5, 6, 7, 8)}
    largest_file(damaged[5] / "arrays").unlink()  # a missing array file
    truncated = largest_file(damaged[6] / "arrays")
    with open(truncated, "r+b") as handle:  # a truncated file
        handle.truncate(truncated.stat().st_size // 2)
    (damaged[7] / "halyard_checkpoint.json").write_bytes(b"\x00\xffnot json{")  # garbage metadata
    shutil.rmtree(damaged[8])
    damaged[8].mkdir()  # an empty folder named like a checkpoint
    garbled = root / "step_00000004"
    metadata = garbled / "arrays" / "_METADATA"
    metadata.write_bytes(os.urandom(metadata.stat().st_size))

    log = tmp_path / "damaged.log"
    child = start_training(config, log)
    assert child.wait(timeout=600) == 0, output(log)[-3000:]
    text = output(log)
    for path in damaged.values():
        assert str(path) in text, f"{path} not reported:\n{text[-3000:]}"
    assert "no commit marker" in text and "missing" in text
    assert str(garbled) in text and "could not be read" in text, text[-3000:]
    result = Trainer(load_config(config)).restore_state()
    assert int(result.step) == REFERENCE_STEPS
    assert_bitwise_equal(reference.final.state.params, result.params)
    assert latest_complete(root) == REFERENCE_STEPS
    # Step 4 was trained and written again from step 3, so it holds the reference's bits now.
    assert_bitwise_equal(reference.params_at(4), Trainer(load_config(config)).restore_state(4).params)
