"""Smoke test of benchmarks/parallelism/context_parallel.py --quick: the compiled programs' collectives send what the
algorithms need, activations fall with the sequence split, and the load-balanced order evens the work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_context_parallel_benchmark(tmp_path: Path) -> None:
    output = tmp_path / "context_parallel.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parallelism" / "context_parallel.py"), "--quick", "--devices", "1", "2",
         "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    report = json.loads(output.read_text())
    implementations = {row["implementation"] for row in report["collectives"]}
    assert implementations == {"ring", "all_gather", "ulysses"}
    for row in report["collectives"]:
        assert abs(row["measured_over_theory"] - 1) < 0.01, row
    split = [row for row in report["memory"] if row["devices"] == 2]
    assert {row["implementation"] for row in split} == implementations
    for row in split:  # half the positions a device: well under one device's activations
        assert row["activations_over_one_device"] < 0.7, row
    for row in report["balance"]:
        assert row["balanced_max_over_min"] == 1.0 and row["natural_max_over_min"] > 2, row
