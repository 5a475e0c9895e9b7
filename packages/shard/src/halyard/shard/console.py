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

_SENTENCE = re.compile(
    rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. Expected number of connected peer ranks is : (\d+)"
)
_WORDS = re.compile(rb"\[Gloo\]|Rank|is connected to|peer ranks|Expected number of connected|is :|\d+|[\s.]")
"""Gloo's vocabulary: a line made of these alone is connection lines its threads wrote into each other."""
_MARKS = (b"[Gl", b"Rank", b"connected", b"peer ranks", b"Expected")
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
        self._mid_line = False
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
        """Write out the complete lines of ``data`` but gloo's, and return the rest: a line still arriving
        that may be gloo's (its threads write lines in pieces, into each other)."""
        *lines, rest = data.split(b"\n")
        for line in lines:
            kept = _without_gloo(line)
            self._write(kept or (b"\n" if self._mid_line else b""))  # a line of gloo's ended one of ours
        if any(mark in rest for mark in _MARKS) or any(
            rest.endswith(mark[:size]) for mark in (b"[Gloo]", b"Expected") for size in range(1, len(mark))
        ):
            return rest
        self._write(rest)
        return b""

    def _write(self, data: bytes) -> None:
        if data:
            self._mid_line = not data.endswith(b"\n")
        while data:
            data = data[os.write(self._console, data) :]

    def close(self) -> None:
        """Put the console back on file descriptor 1 and wait (briefly) for the last lines to go out."""
        with contextlib.suppress(OSError, ValueError):  # a closed or broken sys.stdout
            sys.stdout.flush()
        os.dup2(self._console, 1)  # the pipe's last writer here: the thread reads its end and stops
        self._thread.join(timeout=2)


def _without_gloo(line: bytes) -> bytes:
    """``line`` and its newline, or nothing where gloo wrote it; a rank connected to fewer peers than
    expected is a problem and stays."""
    clean = _SENTENCE.fullmatch(line.strip())
    if clean is not None and clean.group(1) != clean.group(2):
        return line + b"\n"
    sentences_removed = _SENTENCE.sub(b"", line)
    if (b"[Gloo]" in line or b"peer ranks" in line) and not _WORDS.sub(b"", sentences_removed):
        logger.debug("%s", line.decode(errors="replace").strip())
        return b""
    return sentences_removed + b"\n"
