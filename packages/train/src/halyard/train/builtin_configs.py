"""The built-in run configs (``demo``, ``gpt2-small``, ``llama-8b``, ...): YAML files shipped in
``halyard/train/configs/``, named on the command line instead of a path (``train --config demo``)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from halyard.train.config.errors import ConfigError


def builtin_configs() -> dict[str, Path]:
    """Built-in config name -> path of its YAML file."""
    folder = resources.files("halyard.train") / "configs"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def config_summary(path: Path) -> str:
    """The first comment line of a config file: what the config is for."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_config_paths(argv: Sequence[str]) -> list[str]:
    """Replace ``--config NAME`` of a built-in config by its file path (a file of that name wins).

    Raises:
        ConfigError: a bare name (no folder, no .yaml) that is neither a file nor a built-in config; the
            built-in ones are listed.
    """
    builtin = builtin_configs()
    resolved = list(argv)
    for i, arg in enumerate(resolved):
        if arg == "--config" and i + 1 < len(resolved):
            resolved[i + 1] = _config_path(resolved[i + 1], builtin)
        elif arg.startswith("--config="):
            resolved[i] = "--config=" + _config_path(arg.split("=", 1)[1], builtin)
    return resolved


def _config_path(name: str, builtin: dict[str, Path]) -> str:
    if Path(name).exists():
        return name
    if name in builtin:
        return str(builtin[name])
    if Path(name).suffix in (".yaml", ".yml") or len(Path(name).parts) > 1:
        return name  # a path: the loader says it does not exist
    close = difflib.get_close_matches(name, sorted(builtin), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(
        f"--config {name}: no such file, and no built-in config of that name{hint} (built-in configs: "
        f"{', '.join(sorted(builtin))}; `halyard configs` describes them)"
    )
