"""Plain text shards: the whole file is one document, or each line is one."""

from __future__ import annotations

from collections.abc import Iterator

from halyard.data.sources.opening import open_binary
from halyard.data.sources.records import EMPTY_DOCUMENT, INVALID_UTF8, IssueLog, Record, decode_utf8


def read_text(url: str, start_row: int, *, mode: str, strict: bool) -> Iterator[Record]:
    """Yield the documents of a text file from row ``start_row`` on.

    Args:
        url: the file (compression inferred from the suffix: ``.gz``, ``.zst``, ``.bz2``, ``.xz``).
        start_row: the first row to yield; in ``"document"`` mode the file has the single row 0.
        mode: ``"document"`` (the file is one document) or ``"line"`` (each line is one; the newline is
            not part of the document).
        strict: fail on invalid UTF-8 instead of replacing it.

    Raises:
        BadRecordError: invalid UTF-8 under ``strict``.
        ValueError: an unknown ``mode``.
    """
    issues = IssueLog(url)
    if mode == "document":
        if start_row > 0:
            return
        with open_binary(url) as handle:
            raw = handle.read()
        text, replaced = decode_utf8(raw, f"{url}:1", strict)
        if not text.strip():
            issues.report(1, "empty document skipped")
            yield Record(0, None, EMPTY_DOCUMENT)
        else:
            if replaced:
                issues.report(1, "invalid UTF-8 replaced with U+FFFD")
            yield Record(0, text, INVALID_UTF8 if replaced else None)
        return
    if mode != "line":
        raise ValueError(f"text mode {mode!r} is not known; use 'document' or 'line'")
    with open_binary(url) as handle:
        for row, raw in enumerate(handle):
            if row < start_row:
                continue
            text, replaced = decode_utf8(raw.rstrip(b"\r\n"), f"{url}:{row + 1}", strict)
            if not text.strip():
                yield Record(row, None, EMPTY_DOCUMENT)
                continue
            if replaced:
                issues.report(row + 1, "invalid UTF-8 replaced with U+FFFD")
            yield Record(row, text, INVALID_UTF8 if replaced else None)
