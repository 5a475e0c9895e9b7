"""The splash kernel is reachable from a run's config: ``model.attention_implementation: splash`` and its tiles
``model.splash_block_sizes.*`` parse from the command line and train (Pallas's interpret mode on CPU); a bad
tile names its key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trainer_fixtures import load_config, run_losses, write_config

from halyard.models.attention import SplashBlockSizes
from halyard.train.config.errors import ConfigError
from halyard.train.trainer.trainer import Trainer

TILES = ["--model.splash_block_sizes.query", "128", "--model.splash_block_sizes.backward_key", "256"]


def test_a_run_trains_with_the_splash_kernel_and_its_tiles(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache", trainer={"steps": 2})
    config = load_config(path, "--model.attention_implementation", "splash", *TILES)
    assert config.model.attention_implementation == "splash"
    assert config.model.splash_block_sizes == SplashBlockSizes(query=128, backward_key=256)
    Trainer(config).fit()
    losses = run_losses(tmp_path / "run")
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_a_bad_tile_names_its_key(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run.yaml", tmp_path / "run", tmp_path / "cache")
    with pytest.raises(ConfigError, match="splash_block_sizes.key=100 must be a multiple of 128"):
        load_config(path, "--model.splash_block_sizes.key", "100")
