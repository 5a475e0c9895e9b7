"""A run folder written by halyard-train 0.3.0 (fixtures/run-0.3.0: the demo at a tiny size, 4 steps, its
config.yaml, token cache and step-4 checkpoint, made before the package was layered) still works with this
version: generate and eval load it, and train resumes it to step 6."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from halyard.train.cli import main, train_main
from halyard.train.trackers.jsonl import read_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "run-0.3.0"


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "run-0.3.0"
    shutil.copytree(FIXTURE, run)
    return run


def test_a_0_3_run_folder_loads_evaluates_and_resumes(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--run", str(old_run), "--prompt", "def ", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert main(["eval", "--run", str(old_run)]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["step"] == 4 and evaluated["eval_loss"] > 0
    overrides = [
        "--trainer.run_dir",
        str(old_run),
        "--trainer.steps",
        "6",
        "--trainer.compilation_cache",
        "null",
    ]
    assert train_main(["--config", str(old_run / "config.yaml"), *overrides]) == 0
    steps = [record["step"] for record in read_jsonl(old_run / "metrics.jsonl") if "loss" in record]
    assert steps == [1, 2, 3, 4, 5, 6]  # 0.3.0 logged 1-4; this version resumed at 5
    assert (old_run / "checkpoints" / "step_00000006").is_dir()
