"""Errors a user can anticipate end a command with one line on stderr and an exit code, not a traceback.

    error: <what is wrong, where (key, file:line, path), what to do>

Exit code 2 means bad input (a config key, a data source, a tokenizer, a checkpoint that is missing or
was written for other data, an impossible mesh or schedule, a multi-host environment without a
coordinator); 1 means the run failed while running (a damaged checkpoint, a checkpoint write, a non-finite
loss, out of memory). Any other exception is a bug and keeps its traceback. ``HALYARD_DEBUG=1`` (or ``--debug`` on the command line) shows the traceback of
every error.

Halyard's own warnings (a damaged checkpoint skipped, ...) print as one line ``warning: <message>``
while a command runs, without Python's file:line and source line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from halyard.train.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError

INPUT_ERROR_EXIT_CODE = CONFIG_ERROR_EXIT_CODE
RUNTIME_ERROR_EXIT_CODE = 1
DEBUG_ENVIRONMENT_VARIABLE = "HALYARD_DEBUG"
DEBUG_FLAG = "--debug"

T = TypeVar("T")


class RunFailure(RuntimeError):
    """A run that stopped for a reason its message explains completely (exit code 1, no traceback)."""


def exit_code_of(error: BaseException) -> int | None:
    """The exit code for an error a user can anticipate, or None for a bug (which keeps its traceback).

    Args:
        error: the exception that ended the command.
    """
    from halyard.data import DataInputError
    from halyard.export import HfConversionError
    from halyard.shard import ClusterNotFoundError
    from halyard.train.checkpoint.commit_marker import DamagedCheckpointError
    from halyard.train.checkpoint.data_position import DataMismatchError
    from halyard.train.checkpoint.discovery import CheckpointNotFoundError
    from halyard.train.checkpoint.manager import CheckpointWriteError

    bad_input = (
        ConfigError,
        DataInputError,
        HfConversionError,
        CheckpointNotFoundError,
        DataMismatchError,
        ClusterNotFoundError,  # the environment names a multi-host run that cannot be joined
    )
    if isinstance(error, bad_input):
        return INPUT_ERROR_EXIT_CODE
    if isinstance(error, RunFailure | CheckpointWriteError | DamagedCheckpointError):
        return RUNTIME_ERROR_EXIT_CODE
    return None


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined (a list of differences becomes ``a; b; c``)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    joined = lines[0]
    for line in lines[1:]:
        joined += (" " if joined.endswith((":", ".", ";", ")")) else "; ") + line
    return joined


def as_config_error(key: str, build: Callable[[], T]) -> T:
    """``build()``, with a ``ValueError`` it raises turned into a `ConfigError` naming ``key``."""
    try:
        return build()
    except ValueError as error:
        raise ConfigError(f"{key}: {one_line(str(error))}") from error


def debug_requested(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Whether tracebacks were asked for (``--debug`` in ``argv`` or ``HALYARD_DEBUG=1``), and ``argv``
    without ``--debug``."""
    rest = [arg for arg in argv if arg != DEBUG_FLAG]
    environment = os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )
    return environment or len(rest) != len(argv), rest


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside: a warning of a Halyard category prints as ``warning: <message>`` on one line (others as
    Python prints them)."""
    show = warnings.showwarning

    def show_one_line(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not category.__module__.startswith("halyard."):
            show(message, category, *args, **kwargs)
            return
        print(f"warning: {one_line(str(message))}", file=sys.stderr, flush=True)

    warnings.showwarning = show_one_line
    try:
        yield
    finally:
        warnings.showwarning = show


def report_user_errors(main: Callable[[list[str]], int]) -> Callable[[Sequence[str]], int]:
    """Wrap a command's ``main(argv) -> exit code``: anticipated errors print one line and exit, Halyard's
    warnings one line each (`one_line_warnings`).

    ``--debug`` is taken out of ``argv`` before ``main`` sees it.

    Args:
        main: the command; it raises on failure.

    Raises:
        SystemExit: with code 2 (bad input) or 1 (runtime failure) after printing ``error: <message>``.
    """

    @functools.wraps(main)
    def wrapped(argv: Sequence[str]) -> int:
        debug, rest = debug_requested(argv)
        try:
            with one_line_warnings():
                return main(rest)
        except Exception as error:
            code = exit_code_of(error)
            if debug or code is None:
                raise
            print(f"error: {one_line(str(error))}", file=sys.stderr, flush=True)
            raise SystemExit(code) from None

    return wrapped
