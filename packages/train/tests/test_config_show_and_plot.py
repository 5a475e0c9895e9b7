"""`halyard config show` / `train --print-config` (commented YAML that parses back) and the loss plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from trainer_fixtures import fails, load_config, write_config

from halyard.train.cli import main, resolve_config_paths, train_main
from halyard.train.config.parse import parse_config
from halyard.train.plot import PLOT_NAME
from halyard.train.plot_layers import metric_matrix
from halyard.train.run_config import TrainConfig
from halyard.train.trainer.trainer import Trainer


def test_config_show_prints_every_key_with_its_meaning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show", "llama-8b", "--trainer.steps", "7"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if not line.lstrip().startswith(("#", "-")):
            assert lines[index - 1].lstrip().startswith("#"), f"no meaning above {line!r}"
    assert "# Tokens per training sequence." in text and "  steps: 7" in text
    (tmp_path / "shown.yaml").write_text(text)
    expected = parse_config(
        TrainConfig, resolve_config_paths(["--config", "llama-8b", "--trainer.steps", "7"])
    )
    assert parse_config(TrainConfig, [], tmp_path / "shown.yaml") == expected
    assert train_main(["--config", "llama-8b", "--trainer.steps", "7", "--print-config"]) == 0
    assert capsys.readouterr().out == text


def test_fit_writes_the_loss_plot_and_plot_overlays_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    Trainer(
        load_config(
            write_config(tmp_path / "run.yaml", run, tmp_path / "cache", trainer={"steps": 3, "plot": True})
        )
    ).fit()
    assert (run / PLOT_NAME).read_bytes().startswith(b"\x89PNG")
    other = tmp_path / "other"
    other.mkdir()
    rows = [{"step": step, "loss": 6.0 - step} for step in (1, 2, 3)] + [{"step": 3, "eval_loss": 3.5}]
    (other / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "both.png"
    assert main(["plot", "--run", str(run), str(other), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes().startswith(b"\x89PNG") and out.read_bytes() != (run / PLOT_NAME).read_bytes()
    with pytest.raises(SystemExit) as raised:
        main(["plot", "--run", str(tmp_path / "missing")])
    assert raised.value.code == 2 and "missing/metrics.jsonl does not exist" in capsys.readouterr().err


def test_plot_metric_draws_layers_against_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 1, "loss": 5.0}]  # a step that was not watched: no per-layer metrics
    rows += [
        {
            "step": step,
            "loss": 4.0,
            **{f"grad_norm/layers/{i}": step + i / 100 for i in range(12)},
            "grad_norm/layers.mlp/layers/0": 9.0,
        }
        for step in (10, 20, 30)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    names, steps, values = metric_matrix(run, "grad_norm/layers/*")
    assert names == [f"grad_norm/layers/{i}" for i in range(12)]  # layer 10 after layer 9; modules left out
    assert steps == [10, 20, 30]
    # the logged floats read back from JSON
    np.testing.assert_array_equal(values, [[step + i / 100 for step in (10, 20, 30)] for i in range(12)])
    assert main(["plot", "--run", str(run), "--metric", "grad_norm/layers/*"]) == 0
    assert f"wrote {run / 'grad_norm_layers.png'}" in capsys.readouterr().out
    image = imread(run / "grad_norm_layers.png")
    assert image.shape[0] > 100 and image.shape[1] > 400
    assert (
        main(["plot", "--run", str(run), "--metric", "loss", "--out", str(tmp_path / "loss.png")]) == 0
    )  # a line
    code, message = fails(capsys, ["plot", "--run", str(run), "--metric", "grad_nrm/layers/*"])
    assert code == 2 and "close names: grad_norm/layers/0" in message
    code, message = fails(capsys, ["plot", "--run", str(run), str(run), "--metric", "loss"])
    assert code == 2 and "--metric plots one run" in message
