"""Folders that every test worker of one pytest run shares: an expensive session fixture built once per run.

Under pytest-xdist each worker process sets session fixtures up again, and with retiring workers
(tools/pytest_worker_life.py) a run has many workers: a fixture that trains or builds wheels paid its cost in
each. xdist's documented pattern instead: the first worker that needs the folder fills it under a lock in the
directory all workers of the run share; the others wait for it and read what it wrote.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
COMPLETE = ".complete"
"""Written into a folder once ``fill`` returned: a folder without it (a worker died filling it) is refilled."""


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this whole pytest run: shared by its xdist workers, this process's own without."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_folder(
    tmp_path_factory: pytest.TempPathFactory, name: str, fill: Callable[[Path], T]
) -> tuple[Path, T | None]:
    """The folder ``name`` of this run, filled by ``fill(folder)`` in the first worker that asks for it.

    Args:
        tmp_path_factory: pytest's session factory (it knows the run's temporary folder).
        name: the folder's name, unique within the run.
        fill: writes the folder's contents; it runs at most once per run unless it failed.

    Returns:
        The folder, and what ``fill`` returned here (None in a worker that found the folder already filled).
    """
    folder = run_root(tmp_path_factory) / name
    with open(folder.with_name(name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if (folder / COMPLETE).exists():
            return folder, None
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        value = fill(folder)
        (folder / COMPLETE).touch()
        return folder, value
