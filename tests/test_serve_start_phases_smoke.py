"""Smoke run of benchmarks/serve_start_phases.py at its CPU size: the three starts (cold and warm, phase by
phase, and the overlapped start ``halyard serve --hf`` makes) each report every phase and the seconds to the
first answer. Never their speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {
    "cold": ["import", "devices", "load", "engine", "first_request"],
    "warm": ["import", "devices", "load", "engine", "first_request"],
    "overlapped": ["import_jax", "import_rest", "load", "engine", "first_request"],
}


def test_serve_start_phases_small(tmp_path: Path) -> None:
    output = tmp_path / "phases.json"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "serve_start_phases.py"), "--size", "small", "--new-tokens", "2",
        "--work", str(tmp_path / "work"), "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    for start, names in PHASES.items():
        seconds = result[start]
        assert "error" not in seconds, seconds
        assert all(math.isfinite(seconds[name]) and seconds[name] >= 0 for name in names), seconds
        assert math.isclose(seconds["to_first_answer"], sum(seconds[name] for name in names)), seconds
