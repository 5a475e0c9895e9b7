"""Shared setup of the reliability suite: the trainer test helpers, one token cache, one reference run.

The tiny-run helpers (`write_config`, `load_config`, `run_cli`, `assert_bitwise_equal`) live next to the
train package's tests; this folder and that one go on ``sys.path`` so every file here imports them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "packages" / "train" / "tests"))
sys.path.insert(0, str(HERE.parents[1] / "packages" / "data-cache" / "tests"))

from reliability_helpers import Reference, tiny_config  # noqa: E402
from trainer_fixtures import load_config  # noqa: E402

from halyard.train.trainer.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache (and tokenizer) for every tiny run of the suite (``data.cache_dir``)."""
    return tmp_path_factory.mktemp("reliability-cache")


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Reference:
    """The uninterrupted reference run (trained once per session, in this process)."""
    path = tiny_config(tmp_path_factory.mktemp("reference"), "reference", shared_cache)
    return Reference(path, Trainer(load_config(path)).fit())
