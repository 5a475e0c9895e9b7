"""Smoke run of benchmarks/probes/serve_start_phases.py at its CPU size: the three starts (cold and warm, phase by
phase, and the overlapped start ``halyard serve --hf`` makes) each report every phase and the seconds to the
first answer; the warm starts read every step program the cold start compiled from the compilation cache
(`EngineStats.programs_loaded`) and compile none, and lower each from the program the cold start stored
(`halyard.serve.program_store`), tracing none (`EngineStats.programs_traced`). Never their speed."""

from __future__ import annotations

import json
import math
import os
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
        sys.executable, str(ROOT / "benchmarks" / "probes" / "serve_start_phases.py"), "--size", "small", "--new-tokens", "2",
        "--work", str(tmp_path / "work"), "--output", str(output),
    ]  # fmt: skip
    env = dict(
        os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"
    )  # every program stored, however fast
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=ROOT / "benchmarks", env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    for start, names in PHASES.items():
        seconds = result[start]
        assert "error" not in seconds, seconds
        assert all(math.isfinite(seconds[name]) and seconds[name] >= 0 for name in names), seconds
        assert math.isclose(seconds["to_first_answer"], sum(seconds[name] for name in names)), seconds
    compiled = result["cold"]["programs_compiled"]
    assert compiled >= 2 and result["cold"]["programs_loaded"] == 0, result["cold"]
    assert result["cold"]["programs_traced"] == compiled, result["cold"]  # each step program traced, stored
    for start in ("warm", "overlapped"):
        # every program lowered from the store (no trace) and read from the compilation cache (no compile)
        counts = tuple(result[start][f"programs_{kind}"] for kind in ("compiled", "loaded", "traced"))
        assert counts == (0, compiled, 0), result[start]
