"""A test filesystem whose files open only once a gate file exists: a source that is slow on command.

``gated:///path/a.jsonl`` reads ``/path/a.jsonl`` after ``/path/a.jsonl.open`` exists, so a test decides
when a cache build may read a shard (and so when the build can finish). Importing this module registers
the ``gated`` protocol with fsspec in this process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


class GatedFileSystem(LocalFileSystem):
    """Local files behind ``gated://``; opening one blocks until ``<path>.open`` exists."""

    protocol = ("gated",)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        gate = Path(self._strip_protocol(path) + ".open")
        while not gate.exists():
            time.sleep(0.05)
        return super()._open(path, mode, **kwargs)


def open_gate(path: Path) -> None:
    """Let builds read ``path`` (a file behind ``gated://``)."""
    Path(str(path) + ".open").touch()


fsspec.register_implementation("gated", GatedFileSystem, clobber=True)
