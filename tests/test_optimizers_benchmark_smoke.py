"""Smoke test of benchmarks/training/optimizers.py --quick: the runs go through the Trainer, the curves and the
steps-to-target table come out consistent. Never checks which optimizer wins."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_optimizers_benchmark_quick(tmp_path: Path) -> None:
    output = tmp_path / "optimizers.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "training" / "optimizers.py"), "--quick", "--work", str(tmp_path / "runs"),
         "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    assert "| optimizer | best learning rate" in completed.stdout
    record = json.loads(output.read_text())
    assert record["quick"] is True and record["date"]
    assert set(record["best"]) == {"adamw", "lion"}
    target = record["target_eval_loss"]
    assert math.isfinite(target) and target == record["best"]["adamw"]["final_eval_loss"]
    steps = record["settings"]["steps"]
    # AdamW reaches its own final loss by its last evaluation at the latest.
    assert 0 < record["best"]["adamw"]["steps_to_adamw_final_loss"] <= steps
    for run in record["runs"]:
        assert [step for step, _ in run["eval_curve"]] == [3, 6]
        assert run["seconds_per_step"] > 0
