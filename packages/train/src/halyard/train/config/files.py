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
    return load_config_file_with_locations(path)[0]


def load_config_file_with_locations(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Like `load_config_file`, and also where each key was written: `{"trainer.steps": "run.yaml:3"}`.

    Keys of list items are numbered (`trackers.0.type`). A key set by several files maps to the file
    that wins the merge.

    Args:
        path: the YAML file.

    Raises:
        ConfigError: as `load_config_file`.
    """
    locations: dict[str, str] = {}
    content = _load(Path(path), chain=(), locations=locations)
    return content, locations


def key_locations(path: Path, text: str) -> dict[str, str]:
    """Map each dotted key of a YAML document to `file:line` (1-based), without constructing values.

    Args:
        path: the file name to report.
        text: the file's YAML text.
    """
    locations: dict[str, str] = {}

    def visit(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                dotted = f"{prefix}{key_node.value}"
                locations[dotted] = f"{path}:{key_node.start_mark.line + 1}"
                visit(value_node, f"{dotted}.")
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                visit(item, f"{prefix}{index}.")

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if root is not None:
        visit(root, "")
    return locations


def _load(path: Path, chain: tuple[Path, ...], locations: dict[str, str]) -> dict[str, Any]:
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
        merged = deep_merge(
            merged, _load(path.parent / include, chain=(*chain, resolved), locations=locations)
        )
    own_locations = key_locations(path, path.read_text(encoding="utf-8"))
    own_locations.pop(INCLUDE_KEY, None)
    locations.update(own_locations)
    return deep_merge(merged, content)
