"""The built-in run configs (``demo``, ``gpt2-small``, ``llama-8b``, ...): YAML files shipped in
``halyard/train/configs/``, named on the command line instead of a path (``train --config demo``)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path


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
    """Replace ``--config NAME`` of a built-in config by its file path (a file of that name wins)."""
    builtin = builtin_configs()
    resolved = list(argv)
    for i, arg in enumerate(resolved):
        value_index = None
        if arg == "--config" and i + 1 < len(resolved):
            value_index = i + 1
        elif arg.startswith("--config="):
            name = arg.split("=", 1)[1]
            if not Path(name).exists() and name in builtin:
                resolved[i] = f"--config={builtin[name]}"
        if value_index is not None:
            name = resolved[value_index]
            if not Path(name).exists() and name in builtin:
                resolved[value_index] = str(builtin[name])
    return resolved
