"""`parse_config`: defaults, YAML files and command-line overrides into one frozen config dataclass.

draccus does the typed work (decoding dicts into dataclasses, `type:` choices, YAML dumping) and
`halyard.train.config.help` writes `--help`; this module layers the sources, and turns every mistake into a
`ConfigError` that names the key and its source, with a "did you mean" suggestion.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import draccus
import yaml
from draccus.utils import DecodingError, ParsingError

from halyard.train.config.errors import ConfigError
from halyard.train.config.files import load_config_layers
from halyard.train.config.help import config_help
from halyard.train.config.merge import deep_merge, merge_layer
from halyard.train.config.schema import check_keys, describe_field, is_choice_section

ConfigT = TypeVar("ConfigT")

CONFIG_FLAGS = ("--config", "--config_path")
"""Command-line flags naming a YAML file; several may be given, later files override earlier ones."""

COMMAND_LINE = "the command line"


def parse_config(
    config_class: type[ConfigT],
    argv: Sequence[str],
    config_path: str | os.PathLike[str] | None = None,
    *,
    prog: str | None = None,
) -> ConfigT:
    """Build a config from the class defaults, then YAML files, then dotted command-line overrides.

    Layers, lowest priority first: `config_class()`'s defaults; `config_path`; each `--config FILE` in
    `argv`; the overrides in `argv` (`--trainer.steps 200` or `--trainer.steps=200`, values read as YAML so
    `[1, 2]`, `null` and `true` work). A section selected by `type:` keeps the fields set below it as long
    as the type stays the same; switching type (`--optimizer.type lion`) keeps the values set below that the
    new type also has (key by key), and prints to stderr each one it drops.
    `-h`/`--help` prints `config_help` and exits with code 0.

    Args:
        config_class: the root config dataclass (frozen; sections are nested dataclasses, polymorphic
            sections are `halyard.train.config.choices.choice_section` bases or any class answering the choice
            protocol).
        argv: command-line arguments without the program name (e.g. `sys.argv[1:]`).
        config_path: a YAML file applied before any `--config` files of `argv`.
        prog: program name shown by `--help`.

    Raises:
        ConfigError: an unknown key or `type:` (with a suggestion), a value of the wrong type (naming the
            key and the expected type), a missing or malformed file, or a malformed command line.
    """
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        print(config_help(config_class, prog=prog))
        raise SystemExit(0)
    file_paths, overrides_argv = _split_config_flags(argv)
    if config_path is not None:
        file_paths.insert(0, os.fspath(config_path))
    layers = [layer for path in file_paths for layer in load_config_layers(path)]
    overrides = overrides_from_argv(overrides_argv)
    layers.append((COMMAND_LINE, overrides, {key: COMMAND_LINE for key in _dotted_keys(overrides)}))

    merged = _defaults_dict(config_class)
    origins: dict[str, str] = {}
    for source, layer, locations in layers:
        check_keys(config_class, layer, merged, source, locations=locations)
        merged, dropped = merge_layer(config_class, merged, layer, origins)
        for key in dropped:
            where = origins.get(key.key) or next(v for k, v in origins.items() if k.startswith(key.key))
            section = key.key.rsplit(".", 1)[0]
            print(
                f"config: dropped {key.key} (set in {where}): {section}.type {key.new_type} "
                f"(set in {locations.get(section + '.type', source)}) has no such field",
                file=sys.stderr,
            )
        origins.update(locations)
    return decode_config(config_class, merged, origins)


def decode_config(
    config_class: type[ConfigT], values: dict[str, Any], origins: Mapping[str, str] | None = None
) -> ConfigT:
    """Decode a complete nested dict into `config_class`, turning draccus errors into `ConfigError`.

    Args:
        config_class: the root config dataclass.
        values: the nested dict (every required field present).
        origins: dotted key -> where it was set ("run.yaml:3", "the command line"), for messages.

    Raises:
        ConfigError: a value that cannot become its field's type, or a missing required field.
    """
    try:
        return draccus.decode(config_class, values)
    except DecodingError as error:
        key = ".".join(str(part) for part in error.key_path) or "<root>"
        expected = describe_field(config_class, [str(part) for part in error.key_path], values)
        expected_text = f" (expected {expected})" if expected else ""
        origin = f" (set in {origins[key]})" if origins and key in origins else ""
        raise ConfigError(f"config key '{key}'{origin}: {error.message}{expected_text}.") from None
    except (ParsingError, TypeError, ValueError) as error:
        # draccus wraps a section's own check (__post_init__) in "Couldn't instantiate class ...": the
        # section's message, which names the key, is all the user needs.
        check = error
        while check.__cause__ or check.__context__:
            check = check.__cause__ or check.__context__  # type: ignore[assignment]
        if check is error:
            raise ConfigError(f"invalid config for {config_class.__name__}: {error}") from None
        raise ConfigError(_with_origin(str(check), origins or {})) from None


def _with_origin(message: str, origins: Mapping[str, str]) -> str:
    """``message`` of a section's check (``trainer.batch_size=0: must be ...``) with where its key was set."""
    match = re.match(r"([a-z_][\w.]*)=", message)
    origin = origins.get(match[1]) if match else None
    return f"{message} (set in {origin})" if origin else message


def overrides_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Turn `--a.b.c value` / `--a.b.c=value` pairs into a nested dict, each value read as YAML.

    Args:
        argv: the override arguments (no `--config` flags).

    Raises:
        ConfigError: an argument that is not `--key`, or a key without a value.
    """
    nested: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("--") or token == "--":
            raise ConfigError(
                f"unexpected command-line argument '{token}'; overrides look like `--trainer.steps 200`."
            )
        key, has_equals, text = token[2:].partition("=")
        if not has_equals:
            if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
                raise ConfigError(f"command-line option --{key} needs a value, e.g. `--{key} VALUE`.")
            text = argv[index + 1]
            index += 1
        index += 1
        _set_dotted(nested, key, _read_value(text))
    return nested


def save_resolved_config(config: Any, run_dir: str | os.PathLike[str], filename: str = "config.yaml") -> Path:
    """Write the complete config (every field, `type:` of each choice) as YAML into the run directory.

    The file parses back to an equal config with `parse_config(type(config), [], path)`. It is written to
    a temporary name and renamed, so a crash never leaves half a file.

    Args:
        config: the config dataclass instance.
        run_dir: the run directory (created if missing).
        filename: the file name inside `run_dir`.

    Returns:
        The path written.
    """
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    temporary = directory / f".{filename}.tmp"
    with open(temporary, "w", encoding="utf-8") as stream:
        draccus.dump(config, stream, sort_keys=False)
    os.replace(temporary, path)
    return path


def _split_config_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    files: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(argv):
        flag, has_equals, value = argv[index].partition("=")
        if flag in CONFIG_FLAGS:
            if not has_equals:
                if index + 1 >= len(argv):
                    raise ConfigError(f"{flag} needs a file path, e.g. `{flag} run.yaml`.")
                value = argv[index + 1]
                index += 1
            files.append(value)
        else:
            rest.append(argv[index])
        index += 1
    return files, rest


def _defaults_dict(config_class: type) -> dict[str, Any]:
    if is_choice_section(config_class):  # a polymorphic root: its defaults come from the chosen `type:`
        return {}
    try:
        defaults = config_class()
    except TypeError:  # required fields without defaults: files and overrides must supply them
        return {}
    return draccus.encode(defaults)


def _dotted_keys(nested: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in nested.items():
        keys.append(f"{prefix}{key}")
        if isinstance(value, dict):
            keys.extend(_dotted_keys(value, f"{prefix}{key}."))
    return keys


def _read_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_dotted(nested: dict[str, Any], dotted_key: str, value: Any) -> None:
    *parents, leaf = dotted_key.split(".")
    node = nested
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
        node[leaf] = deep_merge(node[leaf], value)
    else:
        node[leaf] = value
