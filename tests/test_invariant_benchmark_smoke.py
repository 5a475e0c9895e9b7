"""Smoke test of benchmarks/parallelism/invariant_step.py --quick: it measures the invariant step against the default
one on 1 device, data 8 and fsdp 8, and the invariant step's losses are bitwise equal on the three."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_invariant_step_benchmark(tmp_path: Path) -> None:
    output = tmp_path / "invariant_step.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parallelism" / "invariant_step.py"), "--quick", "--rounds", "1",
         "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    report = json.loads(output.read_text())
    assert report["invariant_losses_bitwise_equal"] is True, report["arms"]
    for mesh in ("1_device", "data_8", "fsdp_8"):
        assert report["ratios"][f"{mesh}_step_time"] > 0 and report["ratios"][f"{mesh}_temp_bytes"] > 0
    for name, arm in report["arms"].items():
        assert len(arm["losses"]) == 2 and all(loss > 0 for loss in arm["losses"]), name  # warm-up + 1 round
    assert "invariant losses bitwise equal on the 3 meshes: True" in completed.stdout
