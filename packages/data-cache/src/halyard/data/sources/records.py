"""What a shard reader yields, the errors for bad input, and the counters of skipped records."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from halyard.data.errors import DataInputError

logger = logging.getLogger("halyard.data")

# Counter names (also the keys stored in the ledger).
MALFORMED_JSON = "malformed_json"
INVALID_UTF8 = "invalid_utf8"
EMPTY_DOCUMENT = "empty_document"
BAD_EXAMPLE = "bad_example"
COUNTER_NAMES = (MALFORMED_JSON, INVALID_UTF8, EMPTY_DOCUMENT, BAD_EXAMPLE)

# How many bad records per shard are logged with their file:line before the log goes quiet.
LOGGED_PER_SHARD = 5


class Record(NamedTuple):
    """One row of a shard.

    ``row`` is the 0-based row index inside the shard (a line for jsonl and line-mode text, a row for
    parquet and arrow, an element for a json array, 0 for a whole-file text document). ``text`` is None
    when the row is skipped; ``issue`` names the counter the row increments (or None). A chat or
    prompt/completion example has ``text=None`` and its ``(text, is_target)`` pieces in ``segments``; a
    preference pair has its chosen example in ``segments`` and its rejected one in ``rejected`` (two
    documents of the cache, always in the same chunk).
    """

    row: int
    text: str | None
    issue: str | None
    segments: tuple[tuple[str, bool], ...] | None = None
    rejected: tuple[tuple[str, bool], ...] | None = None


class BadRecordError(DataInputError, ValueError):
    """A record that cannot be used under ``strict=True``; the message names file:line and the fix."""


class UnreadableShardError(DataInputError, ValueError):
    """A shard whose bytes are not what its suffix says (``.gz`` that is not gzip, a corrupt parquet file).

    The message names the shard's URL, the format and compression it was read as, and the reader's error.
    """


class ExampleError(DataInputError, ValueError):
    """A record that is not a valid example (unknown role, no assistant turn, a field of the wrong type);
    the message names file:line."""


class MissingFieldError(DataInputError, KeyError):
    """A record without a configured field; the message names the field and the keys found.

    ``option`` is the setting that names the key (``text_field``, ``chosen_field``, ...), when known.
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message, option)

    @property
    def option(self) -> str | None:
        """The setting to change (the argument of ``build_cache``/``ExampleFormat``), or None."""
        return self.args[1] if len(self.args) > 1 else None

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class RecordCounters:
    """Counts of skipped or repaired records, by counter name (see ``COUNTER_NAMES``)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0))

    def add(self, name: str, amount: int = 1) -> None:
        """Increase counter ``name`` by ``amount``."""
        self.counts[name] = self.counts.get(name, 0) + amount

    def as_dict(self) -> dict[str, int]:
        """A copy in the fixed key order used by the ledger."""
        return {name: self.counts.get(name, 0) for name in COUNTER_NAMES}


def decode_utf8(raw: bytes, where: str, strict: bool) -> tuple[str, bool]:
    """Decode bytes as UTF-8; invalid bytes become U+FFFD unless ``strict``.

    Args:
        raw: the bytes of one record.
        where: ``file:line`` used in the error message.
        strict: raise instead of replacing.

    Returns:
        The text and whether a replacement happened.

    Raises:
        BadRecordError: invalid UTF-8 under ``strict=True``.
    """
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError as error:
        if strict:
            raise BadRecordError(
                f"{where}: invalid UTF-8 ({error.reason} at byte {error.start}); fix the file or pass "
                "strict=False to replace the bad bytes with U+FFFD and count them"
            ) from None
        return raw.decode("utf-8", errors="replace"), True


class IssueLog:
    """Logs the first few bad records of a shard with their location, then stays quiet."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.logged = 0

    def report(self, line: int, message: str) -> None:
        """Log ``url:line: message`` while fewer than ``LOGGED_PER_SHARD`` were logged for this shard."""
        if self.logged < LOGGED_PER_SHARD:
            self.logged += 1
            suffix = " (further bad records of this shard are only counted)" if self.logged == 5 else ""
            logger.warning("%s:%d: %s%s", self.url, line, message, suffix)
