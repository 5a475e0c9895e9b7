"""Shared setup of the reliability suite: the trainer test helpers, one token cache, one reference run (one
of each per pytest run, whatever the number of test workers).

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

from reliability_helpers import REFERENCE_STEPS, Reference, tiny_config  # noqa: E402
from run_wide import run_root, shared_folder  # noqa: E402
from trainer_fixtures import load_config  # noqa: E402

from halyard.train.trainer.trainer import FitResult, Trainer  # noqa: E402


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache (and tokenizer) for every tiny run of the suite (``data.cache_dir``), in every worker.

    Only made here: the cache's own build lock lets one process build it while the others wait.
    """
    cache = run_root(tmp_path_factory) / "reliability-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Reference:
    """The uninterrupted reference run: trained once per pytest run, by the first worker that needs it.

    The other workers read its checkpoints; their `Reference.final` holds the final checkpoint's state (a
    restore is bitwise: test_checkpoint_roundtrip.py asserts it).
    """
    folder, fitted = shared_folder(
        tmp_path_factory,
        "reliability-reference",
        lambda folder: Trainer(load_config(tiny_config(folder, "reference", shared_cache))).fit(),
    )
    path = folder / "reference.yaml"
    if fitted is None:
        fitted = FitResult(state=Trainer(load_config(path)).restore_state(REFERENCE_STEPS))
    return Reference(path, fitted)
