"""Opening a shard's bytes through fsspec, decompressing by suffix, with line iteration for every codec."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import fsspec


@contextmanager
def open_binary(url: str) -> Iterator[IO[bytes]]:
    """Open ``url`` for reading bytes, decompressing ``.gz``, ``.zst``, ``.bz2``, ``.xz`` by suffix.

    The result always iterates by lines (the zstandard reader alone does not).
    """
    with fsspec.open(url, "rb", compression="infer") as handle:
        # zstandard's reader has a readline that raises; io.IOBase subclasses iterate lines properly.
        if isinstance(handle, io.IOBase):
            yield handle  # type: ignore[misc]
        else:
            yield io.BufferedReader(handle)  # type: ignore[arg-type]
