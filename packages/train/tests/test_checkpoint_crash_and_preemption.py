"""Real processes: SIGKILL in the middle of a save, and SIGTERM turned into a checkpoint and exit code 143."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from halyard.train.checkpoint.discovery import DamagedCheckpointWarning, latest_complete
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.preemption import PREEMPTION_EXIT_CODE, install_preemption_handler
from halyard.train.checkpoint.restore import restore

SIZE = 300_000
CHILD_ENV = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""),
}

SAVE_THEN_HANG = """
import sys, threading, time
import jax.numpy as jnp
import halyard.train.checkpoint.manager as manager_module
from halyard.train.checkpoint.manager import CheckpointManager

root, stall_commit = sys.argv[1], sys.argv[2] == "stall"
manager = CheckpointManager(root)
manager.save(1, {{"w": jnp.full({size}, 1.0)}}, wait=True)
if stall_commit:  # the arrays get written, the commit marker never does
    manager_module.write_commit_marker = lambda *args, **kwargs: threading.Event().wait()
manager.save(2, {{"w": jnp.full({size}, 2.0)}})
print("saving", flush=True)
time.sleep(600)
"""

TRAIN_UNTIL_PREEMPTED = """
import sys, time
import jax.numpy as jnp
from halyard.train.checkpoint.preemption import PREEMPTION_EXIT_CODE, install_preemption_handler
from halyard.train.checkpoint.manager import CheckpointManager

flag = install_preemption_handler()
manager = CheckpointManager(sys.argv[1])
state = {"w": jnp.zeros(4), "step": 0}
print("ready", flush=True)
while True:
    state = {"w": state["w"] + 1, "step": state["step"] + 1}
    if flag.requested_on_any_process():
        manager.save(state["step"], state, {"reason": "preempted"}, wait=True)
        manager.close()
        sys.exit(PREEMPTION_EXIT_CODE)
    time.sleep(0.01)
"""


def start_child(tmp_path: Path, source: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(source))
    child = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    return child


def wait_for_line(child: subprocess.Popen, expected: str) -> None:
    line = child.stdout.readline()
    if line.strip() != expected:
        child.kill()
        raise AssertionError(f"child printed {line!r}, stderr:\n{child.stderr.read()}")


@pytest.mark.parametrize("stall_commit", ["stall", "no_stall"])
def test_sigkill_mid_save_leaves_the_previous_checkpoint_resumable(tmp_path: Path, stall_commit: str) -> None:
    root = tmp_path / "checkpoints"
    child = start_child(tmp_path, SAVE_THEN_HANG.format(size=SIZE), str(root), stall_commit)
    wait_for_line(child, "saving")
    time.sleep(random.uniform(0.0, 0.2) if stall_commit == "stall" else random.uniform(0.0, 0.05))
    child.kill()  # SIGKILL: no cleanup, no atexit, no flush
    child.wait(timeout=30)
    child.stdout.close()
    child.stderr.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = latest_complete(root)
    if stall_commit == "stall":
        assert step == 1  # the arrays of step 2 may be on disk, but without the marker it is not a checkpoint
    assert step in (1, 2)
    if step == 1:  # the interrupted save is reported by path
        assert any(
            issubclass(w.category, DamagedCheckpointWarning) and "step_00000002" in str(w.message)
            for w in caught
        )
    restored = restore(root / f"step_{step:08d}", {"w": jax.ShapeDtypeStruct((SIZE,), jnp.float32)})
    assert np.array_equal(np.asarray(restored.state["w"]), np.full(SIZE, float(step), np.float32))
    # Training resumes from there and saves step 2 again, replacing what the crash left.
    if step == 1:
        with (
            CheckpointManager(root) as manager,
            pytest.warns(DamagedCheckpointWarning, match="replacing the incomplete"),
        ):
            manager.save(2, {"w": jnp.full(SIZE, 2.5)}, wait=True)
        assert latest_complete(root) == 2


def test_sigterm_in_a_training_loop_saves_and_exits_with_143(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    child = start_child(tmp_path, TRAIN_UNTIL_PREEMPTED, str(root))
    wait_for_line(child, "ready")
    time.sleep(0.3)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=300)  # a hang guard, room for a loaded machine
    assert child.returncode == PREEMPTION_EXIT_CODE == 143, stderr
    step = latest_complete(root)
    assert step is not None and step >= 1
    restored = restore(root / f"step_{step:08d}", {"w": jax.ShapeDtypeStruct((4,), jnp.float32), "step": 0})
    assert restored.state["step"] == step
    assert np.array_equal(np.asarray(restored.state["w"]), np.full(4, float(step), np.float32))
    assert restored.extra_metadata == {"reason": "preempted"}


def test_the_flag_is_set_by_a_real_signal_and_uninstall_restores_the_handler() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    flag = install_preemption_handler(signals=(signal.SIGUSR1,))
    try:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not flag.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flag.requested and flag.signal_number == signal.SIGUSR1
        assert flag.requested_on_any_process()
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_ctrl_c_asks_for_a_save_and_exit_130_and_a_second_ctrl_c_interrupts_at_once() -> None:
    previous = signal.getsignal(signal.SIGINT)
    flag = install_preemption_handler(signals=(signal.SIGTERM, signal.SIGINT))
    try:
        assert flag.exit_code == PREEMPTION_EXIT_CODE == 143  # no signal here: another process's SIGTERM
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not flag.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flag.requested and flag.exit_code == 130
        # no garbage collection meanwhile: a KeyboardInterrupt raised while a gc callback runs (hypothesis
        # registers one) is swallowed as unraisable, and a CI run printed one
        gc.disable()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs between bytecodes of the main thread
    finally:
        gc.enable()
        flag.uninstall()
    assert signal.getsignal(signal.SIGINT) == previous
