"""Reading YAML config files, with `include:` of other files (deep-merged, the including file wins)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import draccus.cfgparsing
import yaml

from halyard.train.config.errors import ConfigError
from halyard.train.config.merge import deep_merge

INCLUDE_KEY = "include"
"""Top-level YAML key naming one file or a list of files (relative to the including file) to start from."""


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file into a plain dict, resolving its `include:` key recursively.

    Included files are merged in the order listed, then the including file's own keys are merged on top
    (nested sections merge key by key; a section whose `type:` changes is replaced, not merged).
    draccus's `!include other.yaml` tag for a single value also works inside any file.

    Args:
        path: the YAML file.

    Raises:
        ConfigError: the file (or an included file) is missing, is not valid YAML, does not hold a mapping,
            or includes itself.
    """
    return _load(Path(path), chain=())


def _load(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ConfigError(f"config include cycle: {cycle}. Remove one of these includes.")
    if not path.is_file():
        included_from = f" (included from {chain[-1]})" if chain else ""
        raise ConfigError(f"config file not found: {path}{included_from}. Check the path.")
    try:
        with open(path, encoding="utf-8") as stream:
            content = draccus.cfgparsing.load_config(stream, file=str(path))
    except (yaml.YAMLError, draccus.utils.ParsingError) as error:
        cause = error.__cause__ or error
        raise ConfigError(f"config file {path} is not valid YAML: {cause}") from None
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of keys to values, found a {type(content).__name__}."
        )
    includes = content.pop(INCLUDE_KEY, [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(item, str) for item in includes):
        raise ConfigError(f"{path}: '{INCLUDE_KEY}' must be a file name or a list of file names.")
    merged: dict[str, Any] = {}
    for include in includes:
        merged = deep_merge(merged, _load(path.parent / include, chain=(*chain, resolved)))
    return deep_merge(merged, content)
