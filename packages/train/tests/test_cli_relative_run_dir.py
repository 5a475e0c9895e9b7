"""The README's main job uses a relative run directory (``runs/demo``): checkpoints and resume must work there."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_fixtures import run_cli, write_config


def test_a_relative_run_dir_checkpoints_and_resumes(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "run.yaml", Path("runs/relative"), tmp_path / "cache", trainer={"steps": 4}
    )
    first = run_cli(["--config", str(config)], devices=1, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoints = tmp_path / "runs" / "relative" / "checkpoints"
    assert (checkpoints / "step_00000004" / "halyard_checkpoint.json").exists()

    resumed = run_cli(["--config", str(config), "--trainer.steps", "6"], devices=1, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (checkpoints / "step_00000006" / "halyard_checkpoint.json").exists()
    metrics = [
        json.loads(line)
        for line in (tmp_path / "runs" / "relative" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [record["step"] for record in metrics if "loss" in record]
    assert steps[-2:] == [5, 6] and steps.count(5) == 1  # the second run started at step 5, not from scratch
