"""Data errors as the run reports them: in the run config's terms, and on every process at once."""

from __future__ import annotations

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
from halyard.data.errors import NotEnoughTokensError
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
    (DataInputError, "data"),
)


def config_error_for(error: DataInputError) -> ConfigError:
    """The one-line `ConfigError` for a data package error, naming the run config key that fixes it
    (``... [run config: data.text_field]``)."""
    key = next(key for kind, key in _CONFIG_KEYS if isinstance(error, kind))
    if isinstance(error, MissingFieldError) and error.option:  # the data: section's key has the same name
        key = f"data.{error.option}"
    return ConfigError(f"{one_line(str(error))} [run config: {key}]")


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
