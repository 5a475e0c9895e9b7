"""The matrix through the Trainer, on the `train` command's code path (`train_main`, in this process):
every optimizer with and without clipping, every schedule, every model family, every layout on 8
simulated devices, accumulation, bf16 compute, z-loss and every tracker; each cell trains (the loss
falls), checkpoints, and resumes after a crash to the same losses, bit for bit. See `matrix_cells` for the rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from matrix_cells import (
    CELLS,
    MESHES,
    MODELS,
    SCHEDULES,
    STEPS,
    Cell,
    run_train,
    write_cell_config,
)

from halyard.models import registered_models
from halyard.train.optim.config import OptimizerConfig


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix-cache")


def logged_steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_matrix_covers_every_option() -> None:
    assert {cell.model for cell in CELLS} == set(registered_models()) == set(MODELS)
    optimizers = set(OptimizerConfig.get_known_choices())
    assert {(cell.optimizer, cell.clip) for cell in CELLS} == {
        (o, c) for o in optimizers for c in (True, False)
    }
    assert {cell.schedule for cell in CELLS} == set(SCHEDULES)
    assert {cell.layout for cell in CELLS} == set(MESHES)
    extras = {key for cell in CELLS for key in cell.trainer}
    assert extras >= {"accumulation", "z_loss_weight"}
    assert "bfloat16" in {cell.compute_dtype for cell in CELLS}
    assert {tracker for cell in CELLS for tracker in cell.trackers} == {"jsonl", "tensorboard", "wandb"}


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.name)
def test_cell_trains_checkpoints_and_resumes_exactly(
    cell: Cell, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    config = write_cell_config(tmp_path / "cell.yaml", cell.config(run_dir, cache_dir))
    assert run_train(["--config", str(config)]) == 0, capsys.readouterr().err[-3000:]
    first = logged_steps(run_dir)
    assert [line["step"] for line in first] == list(range(1, STEPS + 1))
    losses = [line["loss"] for line in first]
    assert all(line["nonfinite"] == 0 for line in first)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"

    # A crash after step 4's checkpoint: the same command resumes there (the same program, so the
    # persistent compilation cache serves it) and redoes steps 5 and 6 bit for bit.
    shutil.rmtree(run_dir / "checkpoints" / f"step_{STEPS:08d}")
    assert run_train(["--config", str(config)]) == 0, capsys.readouterr().err[-3000:]
    resumed = logged_steps(run_dir)
    assert [line["step"] for line in resumed] == list(range(1, STEPS + 1))
    assert [line["loss"] for line in resumed] == losses
    assert (run_dir / "checkpoints" / f"step_{STEPS:08d}").is_dir()
    if "tensorboard" in cell.trackers:
        assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    if "wandb" in cell.trackers:
        assert (run_dir / "wandb_run_id").is_file() and list((run_dir / "wandb").rglob("*.wandb"))
