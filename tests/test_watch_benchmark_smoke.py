"""Smoke test of benchmarks/training/watch.py --quick: the plain, watched and no-example-loss steps run in one process
and every ratio is measured (the figures themselves are for benchmarks/README.md, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_watch_benchmark(tmp_path: Path) -> None:
    output = tmp_path / "watch.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "training" / "watch.py"), "--quick", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    report = json.loads(output.read_text())
    assert set(report["ratios"]) == {
        "every_100_over_off",
        "every_step_over_off",
        "off_over_no_example_losses",
    }
    assert all(ratio > 0 for ratio in report["ratios"].values())
    assert report["statistics_per_watched_step"] > 50  # norms per module and layer, and the model's reports
    assert "every 10 / off" in completed.stdout
