"""Durable file operations: a write that is either complete on disk or absent.

A checkpoint is only as safe as its last write. These helpers write a file under a temporary name,
``fsync`` it, rename it into place (atomic on POSIX file systems) and ``fsync`` the directory so the
rename itself survives a power loss.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (names created, renamed or removed in it) to disk.

    Args:
        directory: an existing directory.

    Raises:
        OSError: when the directory cannot be opened.
    """
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old content or all of ``data``.

    Args:
        path: destination file; its directory must exist.
        data: the complete new content.

    Raises:
        OSError: when the directory is missing or not writable.
    """
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def file_sizes(directory: Path, *, exclude: frozenset[str] = frozenset()) -> dict[str, int]:
    """Sizes in bytes of every regular file under ``directory``, keyed by POSIX path relative to it.

    Args:
        directory: the tree to list.
        exclude: relative paths to leave out (e.g. the commit marker itself).
    """
    sizes: dict[str, int] = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = Path(root) / name
            relative = full.relative_to(directory).as_posix()
            if relative not in exclude:
                sizes[relative] = full.stat().st_size
    return dict(sorted(sizes.items()))
