"""JSON lines and JSON array shards: one object per record, the document in a text field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from halyard.data.sources.opening import open_binary
from halyard.data.sources.records import (
    BAD_EXAMPLE,
    EMPTY_DOCUMENT,
    INVALID_UTF8,
    MALFORMED_JSON,
    BadRecordError,
    ExampleError,
    IssueLog,
    MissingFieldError,
    Record,
    decode_utf8,
)

if TYPE_CHECKING:
    from halyard.data.examples.formats import ExampleFormat


def read_jsonl(
    url: str, start_row: int, *, text_field: str, strict: bool, example: ExampleFormat | None = None
) -> Iterator[Record]:
    """Yield the documents of a JSON-lines file (one object per line) from line ``start_row`` on.

    Args:
        url: the file (compression inferred from the suffix).
        start_row: 0-based index of the first line to yield.
        text_field: the key holding the document text.
        strict: fail on a malformed line or invalid UTF-8 instead of skipping/replacing and counting.
        example: how a record becomes a chat or prompt/completion example (None: a ``text_field`` document).

    Raises:
        BadRecordError: a malformed line, invalid UTF-8 or an invalid example under ``strict`` (names
            file:line).
        MissingFieldError: an object without ``text_field`` (names the field and the keys found).
    """
    issues = IssueLog(url)
    with open_binary(url) as handle:
        for row, raw in enumerate(handle):
            if row < start_row:
                continue
            line = row + 1
            stripped = raw.strip()
            if not stripped:
                yield Record(row, None, EMPTY_DOCUMENT)
                continue
            decoded, replaced = decode_utf8(stripped, f"{url}:{line}", strict)
            try:
                value = json.loads(decoded)
            except json.JSONDecodeError as error:
                message = f"malformed JSON ({error.msg} at column {error.colno})"
                if strict:
                    raise BadRecordError(
                        f"{url}:{line}: {message}; fix the line or pass strict=False to skip and count it"
                    ) from None
                issues.report(line, message + ", skipped")
                yield Record(row, None, MALFORMED_JSON)
                continue
            yield _record_from_object(
                value, row, f"{url}:{line}", text_field, strict, replaced, issues, example
            )


def read_json(
    url: str, start_row: int, *, text_field: str, strict: bool, example: ExampleFormat | None = None
) -> Iterator[Record]:
    """Yield the documents of a JSON file holding an array of objects, from element ``start_row`` on.

    Args:
        url: the file (compression inferred from the suffix).
        start_row: 0-based index of the first element to yield.
        text_field: the key holding the document text.
        strict: fail on a bad element or invalid UTF-8 instead of skipping/replacing and counting.
        example: how a record becomes a chat or prompt/completion example (None: a ``text_field`` document).

    Raises:
        BadRecordError: the file is not a JSON array (always), or a bad element under ``strict``.
        MissingFieldError: an object without ``text_field``.
    """
    issues = IssueLog(url)
    with open_binary(url) as handle:
        raw = handle.read()
    decoded, replaced = decode_utf8(raw, f"{url}:1", strict)
    try:
        value = json.loads(decoded)
    except json.JSONDecodeError as error:
        raise BadRecordError(
            f"{url}:{error.lineno}: malformed JSON ({error.msg}); a .json source must hold one array of "
            "objects (use .jsonl for one object per line)"
        ) from None
    if not isinstance(value, list):
        raise BadRecordError(
            f"{url}: a .json source must hold an array of objects, found {type(value).__name__}; "
            "use .jsonl for one object per line"
        )
    for row in range(start_row, len(value)):
        where = f"{url}[{row}]"
        # A whole-file replacement is counted once, on the first element.
        yield _record_from_object(
            value[row], row, where, text_field, strict, replaced and row == 0, issues, example
        )


def _record_from_object(
    value: Any,
    row: int,
    where: str,
    text_field: str,
    strict: bool,
    replaced: bool,
    issues: IssueLog,
    example: ExampleFormat | None = None,
) -> Record:
    if example is not None and example.has_targets:
        return _example_record(value, row, where, strict, replaced, issues, example)
    if not isinstance(value, dict):
        message = f"expected a JSON object with field {text_field!r}, found {type(value).__name__}"
        if strict:
            raise BadRecordError(f"{where}: {message}; fix the record or pass strict=False to skip it")
        issues.report(row + 1, message + ", skipped")
        return Record(row, None, MALFORMED_JSON)
    if text_field not in value:
        raise MissingFieldError(
            f"{where}: text field {text_field!r} not found; keys found: {sorted(value)}. "
            "Pass text_field=<one of these keys>.",
            "text_field",
        )
    text = value[text_field]
    if text is None:
        return Record(row, None, EMPTY_DOCUMENT)
    if not isinstance(text, str):
        message = f"field {text_field!r} holds {type(text).__name__}, not a string"
        if strict:
            raise BadRecordError(f"{where}: {message}; fix the record or pass strict=False to skip it")
        issues.report(row + 1, message + ", skipped")
        return Record(row, None, MALFORMED_JSON)
    if not text.strip():
        return Record(row, None, EMPTY_DOCUMENT)
    if replaced:
        issues.report(row + 1, "invalid UTF-8 replaced with U+FFFD")
    return Record(row, text, INVALID_UTF8 if replaced else None)


def _example_record(
    value: Any, row: int, where: str, strict: bool, replaced: bool, issues: IssueLog, example: ExampleFormat
) -> Record:
    # Like a missing text field, a missing example field is a configuration error: always raised.
    try:
        if example.kind == "preference":
            segments, rejected = example.pair_segments(value, where)
        else:
            segments, rejected = example.segments(value, where), None
    except ExampleError as error:
        if strict:
            raise BadRecordError(
                f"{error}; fix the record or pass strict=False to skip and count it"
            ) from None
        issues.report(row + 1, str(error).removeprefix(f"{where}: ") + ", skipped")
        return Record(row, None, BAD_EXAMPLE)
    if replaced:
        issues.report(row + 1, "invalid UTF-8 replaced with U+FFFD")
    return Record(row, None, INVALID_UTF8 if replaced else None, segments, rejected)
