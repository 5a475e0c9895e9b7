"""The base of every error that bad input causes (sources, records, tokenizer, an existing cache).

Such an error's message is complete and meant for the user: what is wrong, where (file:line, the path,
the field) and what to do. A program can print it alone, without a traceback; `halyard train` does.
"""

from __future__ import annotations


class DataInputError(Exception):
    """Bad input to the data pipeline, described completely by the message (no traceback needed)."""


class SourceNotFoundError(DataInputError, FileNotFoundError):
    """A source pattern that matches no file (or a shard that vanished); the message names it."""


class TokenizerLoadError(DataInputError, ValueError):
    """A tokenizer file that does not hold a tokenizer; the message names the path."""


class TokenizerNotFoundError(DataInputError, FileNotFoundError):
    """A tokenizer path that does not exist, or a folder without tokenizer.json; the message names it."""


class SourceFormatError(DataInputError, ValueError):
    """A source that cannot be read as it is (unknown suffix, examples in a non-JSON file, empty folder)."""


class NotEnoughTokensError(DataInputError, ValueError):
    """A finished cache (or split) too small for one example of ``seq_len + 1`` tokens: an empty corpus."""


class CacheNotFoundError(DataInputError, FileNotFoundError):
    """No token cache where one was asked for (no ledger.json in the folder); the message names the path."""


class RayStartError(DataInputError, RuntimeError):
    """A local Ray that did not start; the message says why and what to do instead (build without Ray, or
    start Ray and give its address)."""
