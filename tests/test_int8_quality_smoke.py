"""benchmarks/tpu/int8_quality.py --cpu-smoke: the quality benchmark's code at tiny size on CPU (both runs train,
evaluate and are compared; never the figure itself, which needs the chip's 1,000 steps)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_int8_quality_cpu_smoke(tmp_path: Path) -> None:
    output = tmp_path / "int8_quality.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tpu" / "int8_quality.py"), "--cpu-smoke", "--steps", "3",
         "--work-dir", str(tmp_path / "work"), "--output", str(output), "--", "--trainer.compilation_cache", "null"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads(output.read_text())
    assert result["jax"] and result["date"] and "--cpu-smoke" in result["command"]
    bf16, int8 = result["rows"]
    assert "--model.quantization none" in bf16["train_command"]
    assert "--model.quantization int8" in int8["train_command"]
    assert int8["train_command"].endswith("--trainer.compilation_cache null")  # after `--`: passed through
    assert int8["losses"][-1][0] == 3 and int8["status"] == bf16["status"] == "ok"
    # Three steps from the same start: the two runs differ (int8 ran), by far less than 1.5% of the loss.
    assert bf16["validation_loss"] != int8["validation_loss"]
    assert math.isclose(result["ratio"], int8["validation_loss"] / bf16["validation_loss"])
    assert abs(result["ratio"] - 1) < 0.01 and result["within"] is True
