"""The commit marker: the file whose presence (and validity) makes a checkpoint complete.

Protocol (one step):

1. orbax writes the arrays into ``step_N/arrays``. On a POSIX file system orbax itself writes into a
   temporary ``arrays.orbax-checkpoint-tmp*`` directory and renames it when every process has finished
   (TensorStore fsyncs the data files); we do not depend on that: the marker below is what counts.
2. After orbax reports the write finished (on every process: orbax waits for all of them), process 0
   lists every file of ``step_N`` with its size and content checksum (see `checksums`) and writes
   ``halyard_checkpoint.json`` atomically (temporary name, fsync, rename, fsync of the directory). It
   holds the step, the leaf records (path, kind, shape, dtype), the caller's JSON metadata, the file
   sizes and the checksums. Process 0 alone checksums, after that point, because only then is the step
   directory complete on the shared file system, whichever process wrote which file.
3. Only after the marker is durable may older checkpoints be deleted.

A reader trusts a step directory only if the marker parses, names the same step and every listed file
exists with the recorded size; anything else (no marker: a crash mid-save; garbage marker; a truncated or
missing array file) is a `DamagedCheckpointError` naming the path and the reason. Before reading arrays,
a restore also compares every file's checksum with the marker's (`verify_file_checksums`, on every
process: each reaches the same verdict from the same bytes); a mismatch is a `ChecksumMismatchError`.
Markers written before checksums existed have none: those checkpoints load, checked by size, with an
`UnverifiedCheckpointWarning` once per checkpoint root.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halyard.train.checkpoint.checksums import CHECKSUM_ALGORITHM, file_checksum, file_checksums
from halyard.train.checkpoint.durable_files import file_sizes, write_file_atomically
from halyard.train.checkpoint.layout import ARRAYS_DIRECTORY, COMMIT_MARKER, parse_step_directory
from halyard.train.checkpoint.leaves import LeafRecord

MARKER_FORMAT = "halyard-checkpoint"
# Checksums are an optional field of version 1: older readers ignore them and still load the checkpoint.
MARKER_VERSION = 1
_warned_unverified_roots: set[Path] = set()


class DamagedCheckpointError(RuntimeError):
    """A step directory that is not a complete, readable checkpoint.

    Attributes:
        path: the step directory.
        reason: what is wrong with it, in words.
    """

    def __init__(self, path: Path, reason: str):
        super().__init__(f"Checkpoint {path} is incomplete or damaged: {reason}")
        self.path = path
        self.reason = reason

    @property
    def finding(self) -> str:
        """What is wrong, without advice: for a message that goes on to say what was done about it."""
        return self.reason


class ChecksumMismatchError(DamagedCheckpointError):
    """A file of a complete-looking checkpoint whose content differs from what was saved.

    Attributes:
        path: the step directory.
        step: the training step the checkpoint holds.
        file: the damaged file.
        expected: the checksum the commit marker recorded (hexadecimal).
        actual: the checksum of the file's bytes now (hexadecimal).
    """

    def __init__(self, path: Path, step: int, file: Path, expected: str, actual: str):
        super().__init__(
            path,
            f"step {step}: file {file} could not be read back as saved: its {CHECKSUM_ALGORITHM} checksum "
            f"is {actual}, the commit marker recorded {expected} (its bytes changed on disk after the save). "
            "Resuming (trainer.init=auto, CheckpointManager.restore(None, ...)) falls back to the previous "
            "complete checkpoint by itself; for an explicit step or path pick an earlier step, or set "
            "checkpoint.verify_checksums=false (verify_checksums=False) to load the damaged data anyway",
        )
        self.step = step
        self.file = file
        self.expected = expected
        self.actual = actual

    @property
    def finding(self) -> str:
        """Which file failed its checksum (inside the step directory), and both checksums."""
        file = self.file.relative_to(self.path) if self.file.is_relative_to(self.path) else self.file
        return (
            f"{file} failed its {CHECKSUM_ALGORITHM} checksum: it could not be read back as saved "
            f"({self.actual} now, {self.expected} at the save)"
        )


class UnverifiedCheckpointWarning(UserWarning):
    """Issued, once per checkpoint root, when restoring a checkpoint saved before checksums existed."""


@dataclass(frozen=True)
class CommitMarker:
    """The content of ``halyard_checkpoint.json``.

    Attributes:
        step: the training step the checkpoint holds.
        leaves: one record per leaf of the saved state, in pytree order.
        extra_metadata: the caller's JSON metadata (data position, seed, config hash, ...).
        files: size in bytes of every file of the step directory (except the marker), by relative path.
        checksums: xxh3-64 checksum (hexadecimal) of every file in ``files``; empty for checkpoints
            written before checksums existed.
        saved_at_unix: wall-clock time the marker was written (seconds since the epoch).
        process_count: how many JAX processes wrote the checkpoint.
    """

    step: int
    leaves: tuple[LeafRecord, ...]
    extra_metadata: dict[str, Any] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    saved_at_unix: float = 0.0
    process_count: int = 1

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MARKER_FORMAT,
                "version": MARKER_VERSION,
                "step": self.step,
                "saved_at_unix": self.saved_at_unix,
                "process_count": self.process_count,
                "extra_metadata": self.extra_metadata,
                "leaves": [leaf.to_json() for leaf in self.leaves],
                "files": self.files,
                "checksum_algorithm": CHECKSUM_ALGORITHM,
                "checksums": self.checksums,
            },
            indent=1,
        )


def write_commit_marker(
    step_dir: Path,
    step: int,
    leaves: tuple[LeafRecord, ...],
    extra_metadata: dict[str, Any],
    process_count: int,
) -> CommitMarker:
    """Seal a step directory whose arrays are fully written: list and checksum its files, then write the
    marker last.

    Args:
        step_dir: the step directory (``<root>/step_00000100``) holding the finished ``arrays``.
        step: the training step.
        leaves: records from `flatten_for_save`.
        extra_metadata: JSON-serialisable metadata of the caller.
        process_count: number of processes that wrote the arrays.

    Raises:
        DamagedCheckpointError: when the arrays directory is missing (the write did not happen).
        OSError: when a file cannot be read back for its checksum.
    """
    if not (step_dir / ARRAYS_DIRECTORY).is_dir():
        raise DamagedCheckpointError(step_dir, f"no {ARRAYS_DIRECTORY}/ directory to seal")
    sizes = file_sizes(step_dir, exclude=frozenset({COMMIT_MARKER}))
    marker = CommitMarker(
        step=step,
        leaves=leaves,
        extra_metadata=extra_metadata,
        files=sizes,
        checksums=file_checksums(step_dir, list(sizes)),
        saved_at_unix=time.time(),
        process_count=process_count,
    )
    write_file_atomically(step_dir / COMMIT_MARKER, marker.to_json().encode())
    return marker


def read_commit_marker(step_dir: str | Path, *, check_files: bool = True) -> CommitMarker:
    """Read and verify the marker of a step directory.

    Args:
        step_dir: a step directory (``<root>/step_00000100``).
        check_files: also check that every recorded file exists with its recorded size (cheap: one
            ``stat`` per file, no data read).

    Raises:
        DamagedCheckpointError: for a missing, unreadable or inconsistent marker, or a missing or
            truncated file; the message names the path and what is wrong.
    """
    step_dir = Path(step_dir)
    marker_path = step_dir / COMMIT_MARKER
    if not step_dir.is_dir():
        raise DamagedCheckpointError(step_dir, "the directory does not exist")
    if not marker_path.is_file():
        raise DamagedCheckpointError(
            step_dir, f"no commit marker {COMMIT_MARKER} (the save did not finish, e.g. a crash mid-save)"
        )
    try:
        content = json.loads(marker_path.read_text())
        if content.get("format") != MARKER_FORMAT:
            raise ValueError(f"format is {content.get('format')!r}, expected {MARKER_FORMAT!r}")
        if int(content["version"]) > MARKER_VERSION:
            raise ValueError(f"version {content['version']} is newer than this reader ({MARKER_VERSION})")
        algorithm = content.get("checksum_algorithm", CHECKSUM_ALGORITHM)
        if algorithm != CHECKSUM_ALGORITHM:
            raise ValueError(f"checksum_algorithm is {algorithm!r}, this reader knows {CHECKSUM_ALGORITHM!r}")
        marker = CommitMarker(
            step=int(content["step"]),
            leaves=tuple(LeafRecord.from_json(entry) for entry in content["leaves"]),
            extra_metadata=dict(content["extra_metadata"]),
            files={str(name): int(size) for name, size in content["files"].items()},
            checksums={str(name): str(value) for name, value in content.get("checksums", {}).items()},
            saved_at_unix=float(content["saved_at_unix"]),
            process_count=int(content["process_count"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DamagedCheckpointError(step_dir, f"unreadable commit marker {marker_path}: {error}") from error
    named_step = parse_step_directory(step_dir)
    if named_step is not None and named_step != marker.step:
        raise DamagedCheckpointError(
            step_dir, f"the marker says step {marker.step}, the directory name differs"
        )
    if marker.checksums and set(marker.checksums) != set(marker.files):
        raise DamagedCheckpointError(step_dir, "the commit marker's checksums and file list name other files")
    if check_files:
        _check_files(step_dir, marker.files)
    return marker


def verify_file_checksums(step_dir: str | Path, marker: CommitMarker) -> None:
    """Check every file of a checkpoint against the checksums its commit marker recorded.

    Reads the whole checkpoint once. A checkpoint saved before checksums existed is accepted with an
    `UnverifiedCheckpointWarning`, once per checkpoint root.

    Args:
        step_dir: the step directory.
        marker: its commit marker (`read_commit_marker`).

    Raises:
        ChecksumMismatchError: for the first file whose content differs, naming the step, the file, both
            checksums and what to do.
        DamagedCheckpointError: when a listed file cannot be read.
    """
    step_dir = Path(step_dir)
    if not marker.checksums:
        root = step_dir.resolve().parent
        if root not in _warned_unverified_roots:
            _warned_unverified_roots.add(root)
            warnings.warn(
                f"Checkpoint {step_dir} was saved without checksums (by an older Halyard): its files are "
                "checked by size only, so corruption that keeps a file's size would go unnoticed. "
                "Checkpoints written from now on carry checksums",
                UnverifiedCheckpointWarning,
                stacklevel=3,
            )
        return
    for relative, recorded in marker.checksums.items():
        path = step_dir / relative
        try:
            actual = file_checksum(path)
        except OSError as error:
            raise DamagedCheckpointError(
                step_dir, f"step {marker.step}: file {path} could not be read: {error}"
            ) from error
        if actual != recorded:
            raise ChecksumMismatchError(step_dir, marker.step, path, recorded, actual)


def _check_files(step_dir: Path, expected: dict[str, int]) -> None:
    if not expected:
        raise DamagedCheckpointError(step_dir, "the commit marker lists no files")
    for relative, size in expected.items():
        path = step_dir / relative
        if not path.is_file():
            raise DamagedCheckpointError(step_dir, f"file {path} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise DamagedCheckpointError(
                step_dir, f"file {path} has {actual} bytes, the commit marker recorded {size} (truncated?)"
            )
