"""The matrix's interruptions, on the `train` command's code path: SIGTERM and SIGINT in the middle of a
run, and the non-finite policies; after each, the same command resumes the run to its end (and refuses
to resume it with another seed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from matrix_cells import CELLS, run_train, write_cell_config

from halyard.train.checkpoint.manager import CheckpointManager

CELL = CELLS[1]  # the cheapest row: AdamW without clipping, constant schedule, GPT-2, FSDP


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("interruptions-cache")


def cell_config(tmp_path: Path, cache_dir: Path, steps: int, every_steps: int) -> Path:
    values = CELL.config(tmp_path / "run", cache_dir)
    values["trainer"]["steps"] = steps
    values["checkpoint"]["every_steps"] = every_steps
    return write_cell_config(tmp_path / "cell.yaml", values)


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def latest_checkpoint(run_dir: Path) -> int | None:
    with CheckpointManager(run_dir / "checkpoints") as manager:
        return manager.latest_step()


@pytest.mark.parametrize(
    "signal_number", [signal.SIGTERM, signal.SIGINT], ids=lambda s: signal.Signals(s).name
)
def test_a_signal_mid_run_leaves_a_run_the_same_command_resumes(
    signal_number: int, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cell_config(tmp_path, cache_dir, steps=1000, every_steps=2)
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        # Step 5 ran: step 2's checkpoint is complete (a save waits for the previous background write).
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=180)
    # Saved at the step it reached, then exited with 128 + the signal (143 SIGTERM, 130 Ctrl-C), no traceback.
    assert process.returncode == 128 + signal_number, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    stopped_at = latest_checkpoint(tmp_path / "run")
    reached = len(logged(tmp_path / "run"))
    assert stopped_at is not None and stopped_at == reached >= 5, (stopped_at, reached, stderr[-3000:])

    end = stopped_at + 2
    code = run_train(["--config", str(config), "--trainer.steps", str(end)])
    assert code == 0, capsys.readouterr().err[-3000:]
    steps = [line["step"] for line in logged(tmp_path / "run")]
    assert steps == list(range(1, end + 1))
    assert latest_checkpoint(tmp_path / "run") == end


def test_nonfinite_policies_write_no_newer_checkpoint_and_the_run_resumes_with_its_seed(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cell_config(tmp_path, cache_dir, steps=2, every_steps=2)
    run_dir = tmp_path / "run"
    assert run_train(["--config", str(config)]) == 0
    # A learning rate of 1e38 makes the update norm overflow: every later step is non-finite.
    diverging = ["--config", str(config), "--trainer.steps", "4", "--optimizer.learning_rate", "1e38"]

    capsys.readouterr()
    assert run_train([*diverging, "--trainer.nonfinite", "stop"]) == 1
    assert "not finite at step 3" in capsys.readouterr().err
    assert latest_checkpoint(run_dir) == 2

    skip = ["--trainer.nonfinite", "skip", "--trainer.max_nonfinite_steps", "1"]
    assert run_train([*diverging, *skip]) == 1
    assert "2 steps had a non-finite loss" in capsys.readouterr().err
    assert [line["nonfinite"] for line in logged(run_dir)][2:] == [1, 1]
    assert latest_checkpoint(run_dir) == 2

    assert run_train(["--config", str(config), "--trainer.steps", "4"]) == 0
    lines = logged(run_dir)
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    assert [line["nonfinite"] for line in lines] == [0, 0, 0, 0]
    assert lines[3]["loss"] < lines[0]["loss"]

    # Resuming continues the same run: another trainer.seed (whose RNG key the checkpoint holds) is refused.
    capsys.readouterr()
    assert run_train(["--config", str(config), "--trainer.steps", "6", "--trainer.seed", "1"]) == 2
    error = capsys.readouterr().err
    assert "trainer_seed: checkpoint 0, current run 1" in error and "allow_data_mismatch" not in error
