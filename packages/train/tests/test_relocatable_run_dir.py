"""A run directory (its corpus, token cache and checkpoints inside it) moved to another path resumes there,
reusing its cache, to the bits of a run that never moved."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trainer_fixtures import StopAfter, assert_bitwise_equal, load_config, write_config

from halyard.train.trainer.trainer import Trainer


def test_a_moved_run_directory_resumes_with_its_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sections = {"data": {"cache_dir": None}, "trainer": {"steps": 4}, "checkpoint": {"every_steps": None}}
    first = write_config(tmp_path / "first.yaml", tmp_path / "first", tmp_path, **sections)
    with pytest.raises(SystemExit):  # preempted after step 2: a checkpoint at step 2
        Trainer(load_config(first), preemption=StopAfter(2)).fit()
    moved = tmp_path / "elsewhere" / "run"
    shutil.move(tmp_path / "first", moved)
    capsys.readouterr()
    resumed = Trainer(load_config(first, "--trainer.run_dir", str(moved))).fit()
    assert resumed.history[0]["step"] == 3
    assert "building the token cache" not in capsys.readouterr().out  # the moved cache was reused
    reference = Trainer(
        load_config(write_config(tmp_path / "ref.yaml", tmp_path / "ref", tmp_path, **sections))
    ).fit()
    assert_bitwise_equal(reference.state.params, resumed.state.params)
