"""`CheckpointManager`: asynchronous, atomic, policy-driven checkpoints of a training run.

``save`` returns once the arrays are copied off the devices (so the caller may donate or overwrite
them); a background thread waits for orbax to finish writing, then writes the commit marker (see
`commit_marker` for the protocol), and only then deletes checkpoints the `KeepPolicy` no longer wants.
One save is in flight at a time: the next ``save`` (or ``wait``) first waits for the previous one.
The background write runs at a low CPU priority (`writer_priority`), so it slows the training steps
that run beside it as little as the machine allows.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from halyard.train.checkpoint.array_writing import pytree_handler
from halyard.train.checkpoint.commit_marker import (
    DamagedCheckpointError,
    read_commit_marker,
    write_commit_marker,
)
from halyard.train.checkpoint.discovery import (
    CheckpointNotFoundError,
    DamagedCheckpointWarning,
    latest_complete,
    scan_checkpoints,
)
from halyard.train.checkpoint.durable_files import fsync_directory
from halyard.train.checkpoint.layout import (
    ARRAYS_DIRECTORY,
    COMMIT_MARKER,
    UNREADABLE_MARKER,
    step_directory,
)
from halyard.train.checkpoint.leaves import LeafRecord, flatten_for_save
from halyard.train.checkpoint.policies import KeepPolicy, SavePolicy
from halyard.train.checkpoint.process_agreement import Broadcast, broadcast_from_process_zero
from halyard.train.checkpoint.restore import (
    RestoredCheckpoint,
    ShardingsLike,
    State,
    restore,
    restore_weights,
)
from halyard.train.checkpoint.writer_priority import LowPriorityWriters, check_niceness

logger = logging.getLogger(__name__)


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed; raised by the next ``save``/``wait``/``close``."""


class CheckpointManager:
    """Saves, keeps and finds the checkpoints of one run under ``directory``.

    Args:
        directory: the checkpoint root (e.g. ``<run_dir>/checkpoints``); created when missing.
        save_policy: when ``should_save``/``maybe_save`` consider a checkpoint due.
        keep_policy: which complete checkpoints survive once a newer one is durable.
        clock: seconds from a monotonic clock, read on process 0 only (inject a fake one in tests).
        broadcast: makes process 0's save decision everyone's; the default uses
            ``jax.experimental.multihost_utils.broadcast_one_to_all`` when there are several processes.
        process_index: this process's index (default ``jax.process_index()``); process 0 writes the
            commit marker and deletes old checkpoints.
        compress: zstd-compress the arrays. Off by default: trained weights and Adam moments are
            high-entropy floats (~5-8% smaller) while compression multiplies the CPU time of a save by
            about four, CPU that the background write takes from the training loop.
        verify_checksums: before restoring, compare every file with the checksum recorded when it was
            saved (see `checksums`); ``restore(None, ...)`` then falls back past a damaged checkpoint.
            False skips that read of the checkpoint (and loads damaged data without noticing).
        writer_niceness: nice value (0-19) of the threads writing a checkpoint in the background (see
            `writer_priority`): 19, the default, also with the ``SCHED_IDLE`` policy, gives the training
            threads the CPU first; 0 or None leaves priorities alone (the write then competes with the
            steps for the cores).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        save_policy: SavePolicy = SavePolicy(),
        keep_policy: KeepPolicy = KeepPolicy(),
        clock: Callable[[], float] = time.monotonic,
        broadcast: Broadcast = broadcast_from_process_zero,
        process_index: int | None = None,
        compress: bool = False,
        verify_checksums: bool = True,
        writer_niceness: int | None = 19,
    ) -> None:
        self.directory = Path(directory).absolute()  # orbax refuses relative paths (e.g. runs/demo)
        self.save_policy = save_policy
        self.keep_policy = keep_policy
        self._clock = clock
        self._broadcast = broadcast
        self._process_index = jax.process_index() if process_index is None else process_index
        self.verify_checksums = verify_checksums
        check_niceness(writer_niceness)
        self.writer_niceness = writer_niceness
        self._checkpointer = ocp.AsyncCheckpointer(pytree_handler(compress=compress))
        existing = scan_checkpoints(self.directory, warn=False).complete
        self._last_save_step: int | None = max(existing) if existing else None
        self._last_save_time = clock()
        self._writer: threading.Thread | None = None
        self._in_progress_step: int | None = None
        self._error: BaseException | None = None
        if self._process_index == 0:
            self.directory.mkdir(parents=True, exist_ok=True)

    # -- deciding ------------------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether the save policy wants a checkpoint at ``step``, decided by process 0 for everyone.

        A collective in multi-process runs: every process must call it at the same steps.

        Args:
            step: the step just completed.
        """
        due = self._process_index == 0 and self.save_policy.is_due(
            step, self._clock(), self._last_save_step, self._last_save_time
        )
        return bool(self._broadcast(due))

    def maybe_save(self, step: int, state: Any, extra_metadata: Mapping[str, Any] | None = None) -> bool:
        """Save asynchronously if `should_save` says so; returns whether a save started."""
        return self.should_save(step) and self.save(step, state, extra_metadata)

    # -- saving --------------------------------------------------------------------------------
    @property
    def in_progress_step(self) -> int | None:
        """The step being written in the background, or None when no save is in flight."""
        return self._in_progress_step

    def save(
        self, step: int, state: Any, extra_metadata: Mapping[str, Any] | None = None, *, wait: bool = False
    ) -> bool:
        """Start writing a checkpoint of ``state`` at ``step``; returns once the arrays are off the devices.

        Saving a step that already has a complete checkpoint does nothing (returns False), so a
        preemption save right after a scheduled one is harmless. An incomplete directory for the same
        step (a crash mid-save) is replaced.

        Args:
            step: the training step the state belongs to.
            state: any pytree of arrays, typed PRNG keys, numpy arrays and Python numbers (NamedArrays,
                optax states, equinox modules...). It may be donated or overwritten once this returns.
            extra_metadata: JSON-serialisable metadata stored in the commit marker; put the data position
                under ``"data"`` (manifest, seed) so ``restore`` can refuse a mismatch.
            wait: block until the checkpoint is durable (what a preemption save wants).

        Raises:
            CheckpointWriteError: when the previous background write failed.
            TypeError: for a state leaf that cannot be saved, or metadata that is not JSON.
        """
        self.wait()
        metadata = _as_json(extra_metadata)
        step_dir = step_directory(self.directory, step)
        if _is_complete(step_dir):
            logger.info("Checkpoint %s already exists and is complete; not saving it again", step_dir)
            return False
        arrays, records = flatten_for_save(state)
        if self._process_index == 0 and step_dir.exists():
            warnings.warn(_replacing(step, step_dir), DamagedCheckpointWarning, stacklevel=2)
            shutil.rmtree(step_dir)
        _sync_processes(f"halyard_checkpoint_prepare_{step}")
        self._last_save_step, self._last_save_time = step, self._clock()
        self._checkpointer.save(step_dir / ARRAYS_DIRECTORY, args=ocp.args.PyTreeSave(arrays))
        self._in_progress_step = step
        self._writer = threading.Thread(
            target=self._finish_save,
            args=(step, step_dir, records, metadata),
            name=f"halyard-checkpoint-{step}",
        )
        self._writer.start()
        if wait:
            self.wait()
        return True

    def wait(self) -> None:
        """Block until the save in flight (if any) is durable and old checkpoints are cleaned up.

        With several processes this is a collective when a save is in flight (they all are, in step):
        it returns on every process only after process 0 has written the commit marker.

        Raises:
            CheckpointWriteError: when that background write failed.
        """
        if self._writer is not None:
            self._writer.join()
            self._writer = None
            # Process 0 wrote the marker: the others may only call the checkpoint durable after that.
            _sync_processes(f"halyard_checkpoint_committed_{self._last_save_step}")
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointWriteError(
                f"Writing the checkpoint of step {self._last_save_step} under {self.directory} failed: "
                f"{type(error).__name__}: {error}. Complete checkpoints written before it are intact."
            ) from error

    def _finish_save(
        self, step: int, step_dir: Path, records: tuple[LeafRecord, ...], metadata: dict
    ) -> None:
        try:
            with LowPriorityWriters(self.writer_niceness):
                self._checkpointer.wait_until_finished()
                if self._process_index == 0:
                    write_commit_marker(step_dir, step, records, metadata, jax.process_count())
                    self._delete_unwanted(newest=step)
        except BaseException as error:  # surfaced on the caller's thread by wait()
            self._error = error
        finally:
            self._in_progress_step = None

    def _delete_unwanted(self, newest: int) -> None:
        scan = scan_checkpoints(self.directory, warn=False)
        for step in self.keep_policy.steps_to_delete(scan.complete):
            if step != newest:
                _delete_checkpoint(scan.complete[step])
        for step, error in scan.damaged.items():
            if step < newest and error.reason.startswith("no commit marker"):
                logger.warning("Deleting %s, left incomplete by an interrupted save", error.path)
                shutil.rmtree(error.path, ignore_errors=True)

    # -- finding and restoring -----------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (damaged ones skipped with a warning), or None."""
        return latest_complete(self.directory)

    def complete_steps(self) -> list[int]:
        """Steps of every complete checkpoint, ascending."""
        return list(scan_checkpoints(self.directory, warn=False).complete)

    def step_path(self, step: int) -> Path:
        """The step directory of ``step`` (whether or not it exists)."""
        return step_directory(self.directory, step)

    def restore(
        self,
        step_or_path: int | str | Path | None,
        target: State,
        shardings: ShardingsLike = None,
        *,
        expected_data: Mapping[str, Any] | None = None,
        allow_data_mismatch: bool = False,
    ) -> RestoredCheckpoint[State]:
        """Restore a checkpoint of this run (None: the latest complete one); see `restore` for the rest.

        With ``None``, a complete checkpoint whose arrays cannot be read or whose files no longer match
        their checksums (a file garbled in place) is skipped with a `DamagedCheckpointWarning` naming it,
        its commit marker renamed to ``halyard_checkpoint.json.unreadable`` (so that step is written
        again), and the previous complete checkpoint is restored.

        Raises:
            FileNotFoundError: when ``None`` is given and there is no complete checkpoint.
            DamagedCheckpointError: when no complete checkpoint can be read (the newest one's error), or
                an explicitly chosen one is damaged (`ChecksumMismatchError` for changed content).
        """
        if step_or_path is None:
            return self._restore_newest_readable(target, shardings, expected_data, allow_data_mismatch)
        return restore(
            self._resolve(step_or_path),
            target,
            shardings,
            expected_data=expected_data,
            allow_data_mismatch=allow_data_mismatch,
            verify_checksums=self.verify_checksums,
        )

    def _restore_newest_readable(
        self,
        target: State,
        shardings: ShardingsLike,
        expected_data: Mapping[str, Any] | None,
        allow_data_mismatch: bool,
    ) -> RestoredCheckpoint[State]:
        # Discovery checks names and sizes only (one stat per file); contents are checked (checksums) or
        # decoded when read, so a file garbled in place is only found here. Such a checkpoint loses its
        # marker (so the run writes that step again) and the previous complete one is restored instead.
        self.wait()
        steps = sorted(self.complete_steps(), reverse=True)
        if not steps:
            raise CheckpointNotFoundError(f"No complete checkpoint under {self.directory} to restore")
        skipped: list[tuple[int, DamagedCheckpointError]] = []
        for step in steps:
            try:
                restored = restore(
                    self.step_path(step),
                    target,
                    shardings,
                    expected_data=expected_data,
                    allow_data_mismatch=allow_data_mismatch,
                    verify_checksums=self.verify_checksums,
                )
            except DamagedCheckpointError as error:
                if self._process_index == 0:
                    marker = error.path / COMMIT_MARKER
                    marker.replace(marker.with_name(UNREADABLE_MARKER))
                skipped.append((step, error))
                continue
            for damaged, found in skipped:
                warnings.warn(
                    f"checkpoint step {damaged}: {found.finding}; fell back to step {step} (step {damaged} is "
                    f"kept aside in {found.path}, its {COMMIT_MARKER} renamed {UNREADABLE_MARKER}, until the "
                    "run saves that step again)",
                    DamagedCheckpointWarning,
                    stacklevel=3,
                )
            if skipped:  # the skipped steps are due again
                self._last_save_step = step
            return restored
        raise skipped[0][1]

    def restore_weights(
        self,
        step_or_path: int | str | Path | None,
        target_params: State,
        shardings: ShardingsLike = None,
        *,
        params_path: str,
    ) -> State:
        """Restore only the weights subtree; see `restore_weights`."""
        return restore_weights(
            self._resolve(step_or_path),
            target_params,
            shardings,
            params_path=params_path,
            verify_checksums=self.verify_checksums,
        )

    def _resolve(self, step_or_path: int | str | Path | None) -> Path:
        self.wait()
        if step_or_path is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointNotFoundError(f"No complete checkpoint under {self.directory} to restore")
            return self.step_path(step)
        if isinstance(step_or_path, int):
            return self.step_path(step_or_path)
        return Path(step_or_path)

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the save in flight, then release orbax's resources."""
        try:
            self.wait()
        finally:
            self._checkpointer.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_json(extra_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(dict(extra_metadata or {})))
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"extra_metadata must be JSON-serialisable (dicts, lists, str, numbers): {error}"
        ) from error


def _replacing(step: int, step_dir: Path) -> str:
    """What saving ``step`` over the incomplete ``step_dir`` replaces: a copy set aside as damaged, or what
    an interrupted save left."""
    if (step_dir / UNREADABLE_MARKER).exists():
        return (
            f"checkpoint step {step}: replacing the damaged copy kept aside in {step_dir} (it failed "
            "verification when the run resumed) with a new save"
        )
    return f"checkpoint step {step}: replacing the incomplete checkpoint {step_dir} (left by an interrupted save)"


def _is_complete(step_dir: Path) -> bool:
    try:
        read_commit_marker(step_dir)
    except DamagedCheckpointError:
        return False
    return True


def _delete_checkpoint(step_dir: Path) -> None:
    # The marker goes first, so a deletion interrupted halfway leaves an incomplete checkpoint, never a
    # complete-looking one with missing files.
    (step_dir / COMMIT_MARKER).unlink(missing_ok=True)
    fsync_directory(step_dir)
    shutil.rmtree(step_dir, ignore_errors=True)


def _sync_processes(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
