"""Finding the checkpoints of a run: which steps are complete, which are damaged, which is the latest."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from halyard.train.checkpoint.commit_marker import DamagedCheckpointError, read_commit_marker
from halyard.train.checkpoint.layout import parse_step_directory, step_directories, step_directory


class CheckpointNotFoundError(FileNotFoundError):
    """No checkpoint where one was asked for (a path that does not exist, a folder without a complete one)."""


class DamagedCheckpointWarning(UserWarning):
    """Issued when a directory named like a checkpoint is skipped because it is incomplete or damaged."""


@dataclass(frozen=True)
class CheckpointScan:
    """The state of a checkpoint root.

    Attributes:
        complete: step -> directory of every complete checkpoint, ascending.
        damaged: step -> the error explaining why that step directory is not usable.
    """

    complete: dict[int, Path]
    damaged: dict[int, DamagedCheckpointError]


def scan_checkpoints(root: str | Path, *, warn: bool = True) -> CheckpointScan:
    """Classify every ``step_*`` directory under ``root`` as complete or damaged.

    Args:
        root: the checkpoint root; a missing root is empty.
        warn: issue a `DamagedCheckpointWarning` naming the path and the reason for each damaged one.
    """
    complete: dict[int, Path] = {}
    damaged: dict[int, DamagedCheckpointError] = {}
    for step, path in step_directories(root).items():
        try:
            read_commit_marker(path)
        except DamagedCheckpointError as error:
            damaged[step] = error
            if warn:
                warnings.warn(f"Skipping {error}", DamagedCheckpointWarning, stacklevel=2)
        else:
            complete[step] = path
    return CheckpointScan(complete, damaged)


def latest_complete(root: str | Path) -> int | None:
    """The step of the newest complete checkpoint under ``root``, or None when there is none.

    Incomplete or damaged step directories (no commit marker, garbage marker, missing or truncated
    files, an empty directory) are skipped with a `DamagedCheckpointWarning` naming the path, so a crash
    mid-save falls back to the previous checkpoint.

    Args:
        root: the checkpoint root (e.g. ``<run_dir>/checkpoints``).
    """
    for step, path in sorted(step_directories(root).items(), reverse=True):
        try:
            read_commit_marker(path)
        except DamagedCheckpointError as error:
            warnings.warn(f"Skipping {error}", DamagedCheckpointWarning, stacklevel=2)
        else:
            return step
    return None


def resolve_checkpoint(path: str | Path) -> Path:
    """The step directory meant by ``path``: a step directory itself, or the latest complete one under it.

    Accepts what a user writes after ``init: checkpoint``: ``.../step_00000100``, a checkpoint root, or a
    run directory holding ``checkpoints/``.

    Args:
        path: a step directory, a checkpoint root or a run directory.

    Raises:
        DamagedCheckpointError: when ``path`` is a step directory that is incomplete or damaged.
        CheckpointNotFoundError: when ``path`` does not exist or holds no complete checkpoint.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"Checkpoint path {path} does not exist")
    if parse_step_directory(path) is not None:
        read_commit_marker(path)
        return path
    for root in (path, path / "checkpoints"):
        step = latest_complete(root)
        if step is not None:
            return step_directory(root, step)
    raise CheckpointNotFoundError(
        f"No complete checkpoint in {path}: expected a step directory (step_00000100), a checkpoint root "
        f"holding step directories, or a run directory with checkpoints/"
    )
