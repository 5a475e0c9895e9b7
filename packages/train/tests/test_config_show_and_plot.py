"""`halyard config show` / `train --print-config` (commented YAML that parses back) and the loss plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import load_config, write_config

from halyard.train.cli import main, resolve_config_paths, train_main
from halyard.train.config.parse import parse_config
from halyard.train.plot import PLOT_NAME
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
