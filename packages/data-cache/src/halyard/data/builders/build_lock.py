"""One builder at a time per cache folder: a second build of the same cache waits, then reuses it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

LOCK_FILE = ".build.lock"


def _local_path(root: str) -> str | None:
    if root.startswith("file://"):
        return root.removeprefix("file://")
    return None if "://" in root else root


@contextlib.contextmanager
def build_lock(root: str, share: str = "") -> Iterator[None]:
    """Hold an exclusive lock on the local cache folder ``root`` while writing it.

    A second process building the same cache prints that it waits, blocks until the first one is done,
    and then finds the shards finished (nothing is written twice). Object-store URLs (``gs://``, ``s3://``)
    have no lock: run one builder per cache there.

    Args:
        root: the cache folder (or URL).
        share: which hosts' share of the shards is built (``"1-of-2"``); empty for a whole build.
    """
    path = _local_path(root)
    if path is None:
        yield
        return
    with open(os.path.join(path, LOCK_FILE + (f".{share}" if share else "")), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"halyard.data: another process is building {root}; waiting for it to finish",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
