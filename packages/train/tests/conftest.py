"""Shared test setup: helper modules next to the tests are importable (config_example, trainer_fixtures)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """wandb offline, its config and cache folders inside the test's tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb_home"))
