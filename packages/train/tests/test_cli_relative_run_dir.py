"""The README's main job uses a relative run directory (``runs/demo``): checkpoints and resume must work there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matrix_cells import run_train
from trainer_fixtures import write_config


def test_a_relative_run_dir_checkpoints_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(
        tmp_path / "run.yaml", Path("runs/relative"), tmp_path / "cache", trainer={"steps": 4}
    )
    # `train_main` (what the command runs) in this process, from the folder the relative path is relative to:
    # the two runs' process starts were most of this test's time.
    monkeypatch.chdir(tmp_path)
    assert run_train(["--config", str(config)]) == 0
    checkpoints = tmp_path / "runs" / "relative" / "checkpoints"
    assert (checkpoints / "step_00000004" / "halyard_checkpoint.json").exists()

    assert run_train(["--config", str(config), "--trainer.steps", "6"]) == 0
    assert (checkpoints / "step_00000006" / "halyard_checkpoint.json").exists()
    metrics = [
        json.loads(line)
        for line in (tmp_path / "runs" / "relative" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [record["step"] for record in metrics if "loss" in record]
    assert steps[-2:] == [5, 6] and steps.count(5) == 1  # the second run started at step 5, not from scratch
