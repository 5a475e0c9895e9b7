"""``halyard cache``: ``python -m halyard.data``'s ``build`` and ``info``; ``info`` also reads the folder a
run's ``data.cache_dir`` names (default ``<run_dir>/cache``), whose token cache is in ``tokens/``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from halyard.data.cli import make_parser, run_command
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.data_section import TOKEN_CACHE_FOLDER

LEDGER = "ledger.json"
"""The file that makes a folder a token cache."""


def cache_main(argv: Sequence[str]) -> int:
    """Run ``python -m halyard.data`` on ``argv``, with ``info`` given a cache folder or a run's data folder."""
    args = list(argv)
    if args[:1] == ["info"]:
        parsed = make_parser().parse_args(args)
        args = ["info", token_cache_folder(parsed.cache), *(["--json"] if parsed.json else [])]
    return run_command(args)


def token_cache_folder(path: str) -> str:
    """The token cache ``path`` means: the folder itself, or its ``tokens/`` (a run's ``data.cache_dir``).

    Raises:
        ConfigError: no cache there (naming where a run keeps it), or a mixture's folder (naming its
            sources' caches).
    """
    folder = Path(path)
    if "://" in path or (folder / LEDGER).is_file():
        return path
    if (folder / TOKEN_CACHE_FOLDER / LEDGER).is_file():
        return str(folder / TOKEN_CACHE_FOLDER)
    sources = sorted(str(ledger.parent) for ledger in folder.glob(f"*/{TOKEN_CACHE_FOLDER}/{LEDGER}"))
    if sources:
        raise ConfigError(
            f"{folder} holds the token caches of a mixture's sources: give one of {', '.join(sources)}"
        )
    raise ConfigError(
        f"no token cache in {folder} (no {LEDGER} there or in {TOKEN_CACHE_FOLDER}/): a run keeps its cache "
        f"in <data.cache_dir>/{TOKEN_CACHE_FOLDER}, by default <run_dir>/cache/{TOKEN_CACHE_FOLDER}"
    )
