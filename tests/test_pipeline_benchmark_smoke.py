"""Smoke test of benchmarks/parallelism/pipeline.py --quick: the compiled pipeline loop runs the schedule's iterations
(its bubble is the theory's) and activations pass between stages in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_pipeline_benchmark(tmp_path: Path) -> None:
    output = tmp_path / "pipeline.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parallelism" / "pipeline.py"), "--quick", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    report = json.loads(output.read_text())
    rows = {(row["stages"], row["repeats"]): row for row in report["rows"]}
    assert set(rows) == {(1, 1), (2, 1), (2, 2)}
    for key in ((2, 1), (2, 2)):
        row = rows[key]
        assert row["bubble_compiled"] == row["bubble_theory"] == round(1 / (key[1] * 8 + 1), 4), row
        assert row["activations_per_iteration"] >= 2, row  # each stage's output forward, its cotangent back
        assert row["params"] > 0 and row["total"] >= row["params"] + row["optimizer_state"], row
