"""The README's main job, shortened: the built-in demo config trains and its loss falls visibly."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_fixtures import run_cli


def test_demo_config_trains_and_samples(tmp_path: Path) -> None:
    result = run_cli(
        [
            "--config",
            "demo",
            "--trainer.run_dir",
            str(tmp_path / "demo"),
            "--trainer.steps",
            "60",
            "--trainer.log_every",
            "10",
            "--trainer.eval_every",
            "0",
            "--trainer.sample_tokens",
            "8",
            "--data.max_documents",
            "80",
            "--trainer.progress",
            "false",
            "--trainer.batch_size",
            "8",
        ],
        devices=1,
        optimized=True,  # as users run it: 60 steps of its 4 layers run longer at -O0 than they compile
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert losses[-1] < losses[0] - 1.0, losses
    assert "--- sample after step 60 ---" in result.stdout
    assert "eval_bits_per_byte" in result.stdout
