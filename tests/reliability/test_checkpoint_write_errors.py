"""A checkpoint write that fails (disk full) mid-run: the previous checkpoint stays intact and usable, the
message says what happened, and training retries or stops as ``checkpoint.on_write_error`` says.

``os.replace`` raises ``ENOSPC`` for the commit marker of step 4 while ``train`` runs (`train_main`, what the
command runs, in the test's process): the arrays were written, the rename that makes the checkpoint complete
fails, as it does on a full disk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import REFERENCE_STEPS, Reference, tiny_config
from trainer_fixtures import assert_bitwise_equal, load_config

from halyard.train.checkpoint.discovery import scan_checkpoints
from halyard.train.cli import train_main
from halyard.train.trainer.trainer import Trainer


def run_with_a_full_disk(
    tmp_path: Path, shared_cache: Path, policy: str, capfd: pytest.CaptureFixture[str]
) -> tuple[int, str, Path, Path]:
    """``train`` of the tiny run with ``on_write_error: policy`` on a disk that is full for step 4's marker:
    (exit status, what it printed, its config, its checkpoints folder)."""
    config = tiny_config(
        tmp_path, policy, shared_cache, checkpoint={"every_steps": 2, "on_write_error": policy}
    )
    real_replace = os.replace

    def replace_on_a_full_disk(source: Any, destination: Any, *args: Any, **kwargs: Any) -> None:
        if str(destination).endswith("step_00000004/halyard_checkpoint.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(destination))
        real_replace(source, destination, *args, **kwargs)

    capfd.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", replace_on_a_full_disk)
        try:
            status = train_main(["--config", str(config)])
        except SystemExit as exited:  # a user's mistake or a failed write: one line, then the exit status
            status = int(exited.code or 0)
    printed = capfd.readouterr()
    return status, printed.out + printed.err, config, tmp_path / policy / "checkpoints"


def test_retry_reports_the_failure_keeps_training_and_saves_again(
    tmp_path: Path, shared_cache: Path, reference: Reference, capfd: pytest.CaptureFixture[str]
) -> None:
    status, text, config, root = run_with_a_full_disk(tmp_path, shared_cache, "retry", capfd)
    assert status == 0, text[-3000:]
    assert "warning: Writing the checkpoint of step 4" in text and "No space left on device" in text
    assert "on_write_error=retry" in text
    complete = scan_checkpoints(root, warn=False).complete
    assert 4 not in complete and {2, 6, REFERENCE_STEPS} <= set(complete)
    trainer = Trainer(load_config(config))
    assert_bitwise_equal(reference.final.state.params, trainer.restore_state().params)
    assert_bitwise_equal(reference.params_at(2), trainer.restore_state(2).params)


def test_stop_exits_with_the_message_and_the_previous_checkpoint_is_usable(
    tmp_path: Path, shared_cache: Path, reference: Reference, capfd: pytest.CaptureFixture[str]
) -> None:
    status, text, config, root = run_with_a_full_disk(tmp_path, shared_cache, "stop", capfd)
    assert status == 1, text[-3000:]
    assert "error: Writing the checkpoint of step 4" in text and "No space left on device" in text
    assert "Traceback" not in text
    assert list(scan_checkpoints(root, warn=False).complete) == [2]
    assert_bitwise_equal(reference.params_at(2), Trainer(load_config(config)).restore_state().params)
    # The same command resumes from step 2 once the disk has room, and ends with the reference's bits.
    resumed = Trainer(load_config(config)).fit()
    assert_bitwise_equal(reference.final.state.params, resumed.state.params)
