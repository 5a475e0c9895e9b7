"""The one error type of the config system and the `main` wrapper that turns it into exit code 2."""

from __future__ import annotations

import difflib
import functools
import sys
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

CONFIG_ERROR_EXIT_CODE = 2
"""Exit code of a program stopped by a bad configuration (the same as argparse's usage errors)."""


class ConfigError(ValueError):
    """A configuration that cannot be used: unknown key, wrong type, missing file, bad include.

    The message is complete and user-facing (it names the key or file and says what to do), so a program
    prints it without a traceback; `exit_on_config_error` does exactly that.
    """


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return " Did you mean 'x'?" for the closest candidate, or "" when nothing is close.

    Args:
        word: the misspelt key or name.
        candidates: the valid keys or names.
    """
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean '{matches[0]}'?" if matches else ""


def exit_on_config_error(main: Callable[P, R]) -> Callable[P, R]:
    """Wrap a program's `main` so a `ConfigError` prints `error: <message>` to stderr and exits with code 2.

    Any other exception propagates unchanged (with its traceback): only configuration mistakes are the
    user's to fix from the message alone.

    Args:
        main: the function to wrap.
    """

    @functools.wraps(main)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return main(*args, **kwargs)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(CONFIG_ERROR_EXIT_CODE) from None

    return wrapped
