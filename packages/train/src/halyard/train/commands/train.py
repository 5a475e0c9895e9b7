"""``train`` / ``halyard train``: train a model from a config (``--print_config``: show it instead)."""

from __future__ import annotations

from collections.abc import Sequence

from halyard.shard import initialize
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.commands.config_show import PRINT_CONFIG_FLAG, print_config
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.trainer import Trainer


def train_command(argv: Sequence[str]) -> int:
    """Train from ``--config CONFIG [--section.key value ...]`` and print the last metrics."""
    if PRINT_CONFIG_FLAG in argv:  # the resolved config with every meaning, instead of training
        return print_config([arg for arg in argv if arg != PRINT_CONFIG_FLAG])
    config = parse_config(TrainConfig, resolve_config_paths(argv), prog="train")
    initialize()
    result = Trainer(config).fit()
    if result.last_metrics:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(result.last_metrics.items()) if k != "step")
        print(f"finished at step {int(result.state.step)}: {shown}", flush=True)
    return 0
