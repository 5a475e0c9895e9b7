"""Data errors as the run reports them: in the run config's terms, and on every process at once."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from halyard.data import (
    BadRecordError,
    CacheMismatchError,
    DataInputError,
    ExampleError,
    MissingFieldError,
    SourceFormatError,
    SourceNotFoundError,
    TokenizerLoadError,
    TokenizerNotFoundError,
    UnreadableShardError,
)
from halyard.data.errors import NotEnoughTokensError, RayStartError
from halyard.shard import process_index
from halyard.train.checkpoint.process_agreement import broadcast_from_process_zero, true_on_any_process
from halyard.train.config.errors import ConfigError
from halyard.train.user_errors import RunFailure, one_line

# What a data error's fix is called in the run config (the data package names its own arguments).
_CONFIG_KEYS = (
    (MissingFieldError, "data.text_field"),
    (BadRecordError, "data.strict"),
    (CacheMismatchError, "data.cache_dir (another folder, or delete this one)"),
    (NotEnoughTokensError, "data.sources (more text) or data.seq_len"),
    (ExampleError, "data.format and its field names"),
    ((SourceNotFoundError, SourceFormatError, UnreadableShardError), "data.sources"),
    ((TokenizerLoadError, TokenizerNotFoundError), "data.tokenizer"),
    (RayStartError, "data.builder=local, or data.ray_address=auto with a Ray you started"),
    (DataInputError, "data"),
)


def config_error_for(error: DataInputError) -> ConfigError:
    """The one-line `ConfigError` for a data package error, naming the run config key that fixes it
    (``... [run config: data.text_field]``)."""
    key = next(key for kind, key in _CONFIG_KEYS if isinstance(error, kind))
    if isinstance(error, MissingFieldError) and error.option:  # the data: section's key has the same name
        key = f"data.{error.option}"
    if isinstance(error, CacheMismatchError) and error.differences:  # its advice names build_cache's options
        return ConfigError(
            f"{error.folder} holds a token cache built with other settings: {'; '.join(_by_shard(error))}. "
            f"To build it again for these settings, delete {error.folder} or set data.cache_dir to another "
            "folder; to use it as it is, give the settings it was built with [run config: data.cache_dir]"
        )
    return ConfigError(f"{one_line(str(error))} [run config: {key}]")


def _by_shard(error: CacheMismatchError) -> list[str]:
    """The differences, a change that every shard has once (``shards[*].text_field: ...``)."""
    changes: dict[str, list[str]] = {}
    for line in error.differences:
        match = re.fullmatch(r"shards\[(\d+)\](.*)", line, flags=re.DOTALL)
        changes.setdefault(f"shards[*]{match[2]}" if match else line, []).append(line)
    return [
        lines[0] if len(lines) == 1 else f"{change} ({len(lines)} shards)"
        for change, lines in changes.items()
    ]


def agreeing(action: Callable[[], Any]) -> Any:
    """Run ``action`` on this process; if it failed on any process, fail on all of them (a collective).

    Every process meets the same bad source or tokenizer: process 0 raises its error (in the run config's
    terms), the others a `RunFailure` pointing at it.
    """
    failure: BaseException | None = None
    result = None
    try:
        result = action()
    except DataInputError as error:
        failure = config_error_for(error)
        failure.__cause__ = error
    except Exception as error:
        failure = error
    if true_on_any_process(failure is not None):
        zero_failed = broadcast_from_process_zero(failure is not None)
        if failure is not None and (process_index() == 0 or not zero_failed):
            raise failure
        who = "process 0" if zero_failed else "another process"
        raise RunFailure(
            f"{who} stopped while preparing the data (its error, printed by {who}, names the cause)"
        )
    return result
