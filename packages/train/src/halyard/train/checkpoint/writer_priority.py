"""Running a background checkpoint write at low CPU priority, so it takes CPU only the training loop leaves.

Writing a checkpoint costs CPU, mostly in the kernel: copying the bytes into the page cache and
allocating file blocks (on the 2-core development VM about 3 CPU-seconds per GB, measured with `dd`;
TensorStore, which orbax writes through, has no unbuffered write path). On a machine whose cores the
training step already uses, that CPU comes out of the training steps that run during the write. The
write runs in TensorStore's worker threads (named ``ts_pool_worker`` and alike) and in the
manager's commit thread (checksums); while a save is in flight, `LowPriorityWriters` raises their
nice value (Linux schedules each thread by its own), so the scheduler gives the training threads the
CPU first and the write the rest. The write then takes longer when the CPU is busy, never the steps.
At the lowest priority, nice 19, the threads also take Linux's ``SCHED_IDLE`` policy: a nice-19 thread
still gets short time slices on a busy core, and a step whose threads wait for each other stalls for
every slice one of them loses (benchmarks/README.md: steps during a write x1.43 at nice 19, x1.145 with
``SCHED_IDLE`` as well).

The threads keep their lower priority after the save (an unprivileged process may not raise a
thread's priority back), which only matters for a TensorStore read that competes with other work for
the CPU. Where threads cannot be reniced individually (not Linux), this does nothing.

All of it is an optimisation, never a condition of the save: a system call the machine refuses (a gVisor
sandbox, as on a TPU VM, answers ``SCHED_IDLE`` with EINVAL; a seccomp policy may answer EPERM) is skipped
for the rest of the process with one `WriterPriorityWarning`, and the checkpoint is written and committed
as anywhere else.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from types import TracebackType

WRITER_THREAD_PREFIXES = ("ts_",)
"""Kernel thread names (``/proc/self/task/*/comm``) of the threads that write checkpoint files."""

_TASKS = Path("/proc/self/task")

IDLE_NICENESS = 19
"""At this nice value the writer threads also take the ``SCHED_IDLE`` scheduling policy (Linux)."""


def supported() -> bool:
    """Whether single threads can be reniced here (Linux, with ``/proc``)."""
    return sys.platform.startswith("linux") and _TASKS.is_dir()


class WriterPriorityWarning(UserWarning):
    """Lowering the checkpoint writers' priority was refused here; the checkpoints are written anyway."""


_REFUSED: set[str] = set()
"""The tunings this process was refused (``"nice"``, ``"SCHED_IDLE"``): not tried again, warned once."""


def _refused(tuning: str, error: OSError) -> None:
    """Remember that ``tuning`` is refused here and say so the first time."""
    if tuning not in _REFUSED:
        _REFUSED.add(tuning)
        warnings.warn(
            f"lowering the checkpoint writers' CPU priority ({tuning}) was refused here "
            f"({type(error).__name__}: {error}); checkpoints are written and committed as usual, without it",
            WriterPriorityWarning,
            stacklevel=2,
        )


def _lower(thread_id: int, niceness: int) -> bool:
    changed = False
    if "nice" not in _REFUSED:
        try:
            if os.getpriority(os.PRIO_PROCESS, thread_id) < niceness:
                os.setpriority(os.PRIO_PROCESS, thread_id, niceness)
                changed = True
        except ProcessLookupError:  # the thread ended
            return changed
        except OSError as error:  # EPERM from a policy, or a sandbox without the call
            _refused("nice", error)
    idle = getattr(os, "SCHED_IDLE", None)
    if niceness >= IDLE_NICENESS and idle is not None and "SCHED_IDLE" not in _REFUSED:
        try:
            if os.sched_getscheduler(thread_id) != idle:
                os.sched_setscheduler(thread_id, idle, os.sched_param(0))
                changed = True
        except ProcessLookupError:
            pass
        except OSError as error:  # gVisor (a TPU VM's sandbox) answers EINVAL
            _refused("SCHED_IDLE", error)
    return changed


def lower_writer_threads(niceness: int) -> int:
    """Set every checkpoint-writing thread of this process to at least ``niceness``; returns how many changed.

    Args:
        niceness: the nice value, 0 (normal) to 19 (lowest priority).
    """
    changed = 0
    try:
        tasks = list(_TASKS.iterdir())
    except OSError as error:  # /proc hidden or restricted
        _refused("listing the threads", error)
        return 0
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(WRITER_THREAD_PREFIXES):
            changed += _lower(int(task.name), niceness)
    return changed


def check_niceness(niceness: int | None) -> None:
    """Raise ValueError for a nice value outside 0..19 (None is allowed: leave priorities alone)."""
    if niceness is not None and (not isinstance(niceness, int) or not 0 <= niceness <= 19):
        raise ValueError(
            f"writer_niceness must be an int between 0 (normal priority) and 19 (lowest), or None; "
            f"got {niceness!r}"
        )


class LowPriorityWriters:
    """While entered, keeps the calling thread and the checkpoint-writing threads at ``niceness``.

    TensorStore starts worker threads on demand, so they are looked up again every ``interval`` seconds
    by a small daemon thread until the context exits, and once more on exit (a thread started between
    two looks runs at normal priority until the next one).

    Args:
        niceness: nice value for the writers, 1 to 19 (19: also the ``SCHED_IDLE`` policy, i.e. run
            only when no other thread wants the core); 0 or None does nothing.
        interval: seconds between two looks for new writer threads.

    Raises:
        ValueError: ``niceness`` outside 0..19.
    """

    def __init__(self, niceness: int | None, interval: float = 0.25) -> None:
        check_niceness(niceness)
        self.niceness = niceness if supported() else None
        self.interval = interval
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> LowPriorityWriters:
        if self.niceness:
            _lower(threading.get_native_id(), self.niceness)
            lower_writer_threads(self.niceness)
            self._watcher = threading.Thread(
                target=self._watch, name="halyard-checkpoint-priority", daemon=True
            )
            self._watcher.start()
        return self

    def _watch(self) -> None:
        assert self.niceness is not None
        while not self._stop.wait(self.interval):
            lower_writer_threads(self.niceness)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._watcher is not None and self.niceness:
            self._watcher.join()
            lower_writer_threads(self.niceness)  # threads started since the last look serve the next save
