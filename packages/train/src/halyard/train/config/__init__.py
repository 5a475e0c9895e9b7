"""Configs: frozen dataclasses that are the YAML schema, the command line and the documentation at once.

    config = parse_config(TrainConfig, sys.argv[1:])            # defaults < --config FILE < --a.b value
    save_resolved_config(config, run_dir)                         # run_dir/config.yaml, parses back equal

Polymorphic sections subclass `draccus.ChoiceRegistry` and pick their class with `type:`. Mistakes raise
`ConfigError`; wrap `main` in `exit_on_config_error` to print them and exit with code 2.
"""

from halyard.train.config.errors import (
    CONFIG_ERROR_EXIT_CODE,
    ConfigError,
    did_you_mean,
    exit_on_config_error,
)
from halyard.train.config.files import INCLUDE_KEY, load_config_file
from halyard.train.config.flatten import flatten_config
from halyard.train.config.merge import deep_merge
from halyard.train.config.parse import (
    config_help,
    decode_config,
    overrides_from_argv,
    parse_config,
    save_resolved_config,
)

__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "INCLUDE_KEY",
    "ConfigError",
    "config_help",
    "decode_config",
    "deep_merge",
    "did_you_mean",
    "exit_on_config_error",
    "flatten_config",
    "load_config_file",
    "overrides_from_argv",
    "parse_config",
    "save_resolved_config",
]
