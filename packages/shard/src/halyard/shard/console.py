"""Keep gloo's connection lines off the console of a multi-process CPU run.

Gloo (jaxlib's CPU collectives) writes ``[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of
connected peer ranks is : 7`` to the process's stdout, from C++ and unconditionally, once per rank for every
communicator a program creates: dozens of lines per run. `filter_gloo_connection_lines` puts a pipe in front
of file descriptor 1 and forwards everything but those lines, which go to the ``halyard.shard`` logger at
debug level. A rank connected to fewer peers than expected is a problem and stays on the console.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading

logger = logging.getLogger("halyard.shard")

_CONNECTED = re.compile(
    rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. Expected number of connected peer ranks is : \1\n"
)
_PREFIX = b"[Gloo]"
_installed: _StdoutFilter | None = None


def filter_gloo_connection_lines() -> None:
    """Drop gloo's "Rank N is connected to M peer ranks" lines from this process's stdout (idempotent).

    Everything else written to file descriptor 1 (Python's prints, other libraries, child processes that
    inherit it) passes unchanged; the pipe is taken down at exit, after the last line is forwarded.
    """
    global _installed
    if _installed is None:
        _installed = _StdoutFilter()
        atexit.register(_installed.close)


class _StdoutFilter:
    def __init__(self) -> None:
        sys.stdout.flush()
        self._console = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        self._thread = threading.Thread(
            target=self._forward, args=(read_end,), daemon=True, name="gloo-filter"
        )
        self._thread.start()

    def _forward(self, read_end: int) -> None:
        pending = b""
        while chunk := os.read(read_end, 65536):
            pending = self._write_through(pending + chunk)
        self._write(pending)
        os.close(read_end)

    def _write_through(self, data: bytes) -> bytes:
        """Drop the complete connection lines of ``data``, write out what cannot belong to one, and return
        the rest (a line of gloo's still arriving: its threads write lines in pieces, interleaved)."""
        while (match := _CONNECTED.search(data)) is not None:
            logger.debug("%s", match.group(0).decode(errors="replace").rstrip())
            data = data[: match.start()] + data[match.end() :]
        held = len(data)
        start = data.find(_PREFIX)
        while start != -1:
            if b"\n" not in data[start:]:
                held = start
                break
            start = data.find(_PREFIX, start + 1)
        for size in range(min(len(_PREFIX) - 1, held), 0, -1):  # the start of "[Gloo]" at the very end
            if data[:held].endswith(_PREFIX[:size]):
                held -= size
                break
        self._write(data[:held])
        return data[held:]

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self._console, data) :]

    def close(self) -> None:
        """Put the console back on file descriptor 1 and wait (briefly) for the last lines to go out."""
        with contextlib.suppress(OSError, ValueError):  # a closed or broken sys.stdout
            sys.stdout.flush()
        os.dup2(self._console, 1)  # the pipe's last writer here: the thread reads its end and stops
        self._thread.join(timeout=2)
