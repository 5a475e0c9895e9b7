"""The two named-layer benchmarks run end to end in --quick mode and report their ratio."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[4] / "benchmarks" / "training"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "printed"),
    [("named_overhead.py", "ratio named/plain:"), ("stacked_compile.py", "compile ratio 24/2 layers:")],
)
def test_benchmark_quick_run_prints_ratio_and_writes_json(script, printed, tmp_path):
    output = tmp_path / "result.json"
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert printed in completed.stdout
    result = json.loads(output.read_text())
    assert result["quick"] is True
    assert result["ratio"] > 0
