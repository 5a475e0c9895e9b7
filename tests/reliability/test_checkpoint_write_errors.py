"""A checkpoint write that fails (disk full) mid-run: the previous checkpoint stays intact and usable, the
message says what happened, and training retries or stops as ``checkpoint.on_write_error`` says.

The child process's ``os.replace`` raises ``ENOSPC`` for the commit marker of step 4: the arrays were
written, the rename that makes the checkpoint complete fails, as it does on a full disk.
"""

from __future__ import annotations

from pathlib import Path

from reliability_helpers import REFERENCE_STEPS, Reference, output, start_training, tiny_config
from trainer_fixtures import assert_bitwise_equal, load_config

from halyard.train.checkpoint.discovery import scan_checkpoints
from halyard.train.trainer.trainer import Trainer

DISK_FULL_AT_STEP_4 = """
import errno, os
real_replace = os.replace
def replace_on_a_full_disk(source, destination, *args, **kwargs):
    if str(destination).endswith("step_00000004/halyard_checkpoint.json"):
        raise OSError(errno.ENOSPC, "No space left on device", str(destination))
    return real_replace(source, destination, *args, **kwargs)
os.replace = replace_on_a_full_disk
"""


def run_with_a_full_disk(tmp_path: Path, shared_cache: Path, policy: str) -> tuple[int, str, Path, Path]:
    config = tiny_config(
        tmp_path, policy, shared_cache, checkpoint={"every_steps": 2, "on_write_error": policy}
    )
    log = tmp_path / f"{policy}.log"
    child = start_training(config, log, setup=DISK_FULL_AT_STEP_4)
    return child.wait(timeout=600), output(log), config, tmp_path / policy / "checkpoints"


def test_retry_reports_the_failure_keeps_training_and_saves_again(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    status, text, config, root = run_with_a_full_disk(tmp_path, shared_cache, "retry")
    assert status == 0, text[-3000:]
    assert "warning: Writing the checkpoint of step 4" in text and "No space left on device" in text
    assert "on_write_error=retry" in text
    complete = scan_checkpoints(root, warn=False).complete
    assert 4 not in complete and {2, 6, REFERENCE_STEPS} <= set(complete)
    trainer = Trainer(load_config(config))
    assert_bitwise_equal(reference.final.state.params, trainer.restore_state().params)
    assert_bitwise_equal(reference.params_at(2), trainer.restore_state(2).params)


def test_stop_exits_with_the_message_and_the_previous_checkpoint_is_usable(
    tmp_path: Path, shared_cache: Path, reference: Reference
) -> None:
    status, text, config, root = run_with_a_full_disk(tmp_path, shared_cache, "stop")
    assert status == 1, text[-3000:]
    assert "error: Writing the checkpoint of step 4" in text and "No space left on device" in text
    assert "Traceback" not in text
    assert list(scan_checkpoints(root, warn=False).complete) == [2]
    assert_bitwise_equal(reference.params_at(2), Trainer(load_config(config)).restore_state().params)
    # The same command resumes from step 2 once the disk has room, and ends with the reference's bits.
    resumed = Trainer(load_config(config)).fit()
    assert_bitwise_equal(reference.final.state.params, resumed.state.params)
