"""``halyard config show CONFIG [overrides]`` and ``train --print-config``: the resolved config, commented."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.config.show import commented_yaml
from halyard.train.run_config import TrainConfig

PRINT_CONFIG_FLAG = "--print-config"
"""`train` flag: print the resolved config (with meanings) and exit instead of training."""


def print_config(argv: Sequence[str]) -> int:
    """Print the config ``argv`` resolves to (``--config`` files and overrides), each key with its meaning."""
    config = parse_config(TrainConfig, resolve_config_paths(argv), prog="train")
    print(commented_yaml(config), end="")
    return 0


def config_main(argv: Sequence[str]) -> int:
    """``halyard config show CONFIG [--KEY VALUE ...]``: the resolved YAML with comments."""
    parser = argparse.ArgumentParser(
        prog="halyard config",
        description="show: print a config as it resolves (built-in name or file, then overrides), "
        "every key with its meaning as a comment; the output is a valid config file.",
    )
    parser.add_argument("action", choices=["show"])
    parser.add_argument("config", help="a YAML file or a built-in config (halyard configs)")
    args, overrides = parser.parse_known_args(list(argv))
    return print_config(["--config", args.config, *overrides])
