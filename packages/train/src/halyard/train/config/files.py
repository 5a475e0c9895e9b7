"""Reading YAML config files, with `include:` of other files (deep-merged, the including file wins)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import draccus.cfgparsing
import yaml

from halyard.train.config.errors import ConfigError
from halyard.train.config.merge import deep_merge

INCLUDE_KEY = "include"
"""Top-level YAML key naming one file or a list of files (relative to the including file, or built-in
config names such as `demo`) to start from."""


ConfigLayer = tuple[str, dict[str, Any], dict[str, str]]
"""One file's own keys: (its path, its content without `include:`, dotted key -> "file:line")."""


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file into a plain dict, resolving its `include:` key recursively.

    Included files are merged in the order listed, then the including file's own keys are merged on top
    (nested sections merge key by key; a section whose `type:` changes is replaced, not merged: use
    `parse_config`, which merges `load_config_layers` by the schema, to keep the fields both types have).
    draccus's `!include other.yaml` tag for a single value also works inside any file.

    Args:
        path: the YAML file.

    Raises:
        ConfigError: the file (or an included file) is missing, is not valid YAML, does not hold a mapping,
            or includes itself.
    """
    merged: dict[str, Any] = {}
    for _, content, _ in load_config_layers(path):
        merged = deep_merge(merged, content)
    return merged


def load_config_layers(path: str | os.PathLike[str]) -> list[ConfigLayer]:
    """The layers of a config file, lowest priority first: its includes (recursively, in the order
    listed), then its own keys. An include is a path relative to the including file, or the name of a
    built-in config (`include: demo`) when no such file exists.

    Raises:
        ConfigError: as `load_config_file`.
    """
    layers: list[ConfigLayer] = []
    _load(Path(path), chain=(), layers=layers)
    return layers


def builtin_config_path(name: str) -> Path | None:
    """The YAML file of the built-in config `name` (`demo`, ...), or None when there is none."""
    candidate = resources.files("halyard.train") / "configs" / f"{name}.yaml"
    return Path(str(candidate)) if candidate.is_file() else None


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


def _load(path: Path, chain: tuple[Path, ...], layers: list[ConfigLayer]) -> None:
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
    for include in includes:
        _load(_include_path(path, include), chain=(*chain, resolved), layers=layers)
    own_locations = key_locations(path, path.read_text(encoding="utf-8"))
    own_locations.pop(INCLUDE_KEY, None)
    layers.append((str(path), content, own_locations))


def _include_path(including: Path, include: str) -> Path:
    relative = including.parent / include
    if relative.is_file():
        return relative
    return builtin_config_path(include) or relative
