"""The background checkpoint write runs at low CPU priority (its threads' nice value), and bad values fail."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from trainer_fixtures import write_config

from halyard.train.checkpoint import writer_priority
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.writer_priority import LowPriorityWriters, WriterPriorityWarning, supported

linux_only = pytest.mark.skipif(not supported(), reason="threads are reniced one by one only on Linux")


def writer_thread_priorities() -> dict[int, tuple[int, int]]:
    """(nice value, scheduling policy) of every TensorStore worker thread of this process, by thread id."""
    values = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("ts_"):
                thread = int(task.name)
                values[thread] = (os.getpriority(os.PRIO_PROCESS, thread), os.sched_getscheduler(thread))
        except (OSError, ProcessLookupError):
            continue
    return values


@linux_only
def test_an_async_save_lowers_the_writer_threads_and_leaves_the_caller_alone(tmp_path: Path) -> None:
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    state = {"w": jax.numpy.arange(4096.0).reshape(64, 64), "step": 3}
    with CheckpointManager(tmp_path / "checkpoints") as manager:
        assert manager.save(1, state)
        manager.wait()
        priorities = writer_thread_priorities()  # before the restore, which may start more at normal priority
        restored = manager.restore(1, state).state
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert priorities, "TensorStore wrote the checkpoint, so its worker threads exist"
    # nice 19 (the default) and SCHED_IDLE: the writers run only when no training thread wants the core
    assert all(nice >= 19 and policy == os.SCHED_IDLE for nice, policy in priorities.values()), priorities
    training_thread = threading.get_native_id()
    assert os.getpriority(os.PRIO_PROCESS, training_thread) == caller
    assert os.sched_getscheduler(training_thread) == os.SCHED_OTHER


@linux_only
def test_low_priority_writers_renices_the_thread_that_enters_it() -> None:
    seen: list[int] = []

    def writer() -> None:
        with LowPriorityWriters(12, interval=0.01):
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    assert seen and seen[0] >= 12


@linux_only
def test_only_the_lowest_priority_also_takes_the_idle_policy() -> None:
    policies: dict[int, int] = {}

    def writer(niceness: int) -> None:
        with LowPriorityWriters(niceness, interval=0.01):
            policies[niceness] = os.sched_getscheduler(threading.get_native_id())

    for niceness in (12, 19):
        thread = threading.Thread(target=writer, args=(niceness,))
        thread.start()
        thread.join()
    assert policies == {12: os.SCHED_OTHER, 19: os.SCHED_IDLE}


@linux_only
def test_a_refused_scheduling_call_skips_the_tuning_not_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TPU VM's gVisor sandbox refuses SCHED_IDLE with EINVAL: saves and restores still work, one warning."""
    refused: list[int] = []

    def sandbox_refuses(thread: int, policy: int, param: object) -> None:
        refused.append(thread)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(os, "sched_setscheduler", sandbox_refuses)
    monkeypatch.setattr(writer_priority, "_REFUSED", set())  # this test's process has not been refused yet
    state = {"w": jax.numpy.arange(4096.0).reshape(64, 64), "step": 3}
    with (
        pytest.warns(WriterPriorityWarning) as warned,
        CheckpointManager(tmp_path / "checkpoints") as manager,
    ):
        for step in (1, 2):  # the second save neither tries again nor warns again
            assert manager.save(step, {**state, "step": step})
            manager.wait()
        restored = manager.restore(2, state).state
    assert len(refused) == 1
    assert len(warned) == 1
    assert "(SCHED_IDLE) was refused here (OSError: [Errno 22] Invalid argument)" in str(warned[0].message)
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert restored["step"] == 2
    marker = read_commit_marker(tmp_path / "checkpoints" / "step_00000002")  # sealed, checksummed
    assert marker.step == 2 and marker.checksums and set(marker.checksums) == set(marker.files)
    # what was not refused still applies: the writers' nice value
    assert all(nice >= 19 for nice, _ in writer_thread_priorities().values())


@pytest.mark.parametrize("niceness", [-1, 20, "19", 1.5])
def test_a_writer_niceness_outside_0_to_19_is_refused(tmp_path: Path, niceness: object) -> None:
    with pytest.raises(ValueError, match=r"writer_niceness must be an int between 0 .* and 19"):
        CheckpointManager(tmp_path, writer_niceness=niceness)  # type: ignore[arg-type]


# The `train` command in a fresh process (so every TensorStore thread in it served this run's saves), then
# the nice value and policy of each of those threads.
TRAIN_THEN_REPORT = """
import json, os, sys
from pathlib import Path
from halyard.train.cli import train_main
assert train_main(["--config", sys.argv[1]]) == 0
found = {}
for task in Path("/proc/self/task").iterdir():
    if (task / "comm").read_text().startswith("ts_"):
        thread = int(task.name)
        found[thread] = [os.getpriority(os.PRIO_PROCESS, thread), os.sched_getscheduler(thread)]
print(json.dumps(found))
"""


@linux_only
def test_the_train_command_writes_its_checkpoints_from_idle_threads(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", trainer={"steps": 2})
    env = dict(
        os.environ, XLA_FLAGS=os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""), JAX_PLATFORMS="cpu"
    )
    completed = subprocess.run(
        [sys.executable, "-c", TRAIN_THEN_REPORT, str(config)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints").is_dir()
    priorities = json.loads(completed.stdout.strip().splitlines()[-1])
    assert priorities, "the run's checkpoints were written by TensorStore's threads"
    assert all(nice >= 19 and policy == os.SCHED_IDLE for nice, policy in priorities.values()), priorities
