"""benchmarks/tpu_train.py --cpu-smoke: the TPU benchmark's code at tiny size on CPU (figures produced and
sane, a failing configuration reported as a row, never the speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tpu_train_cpu_smoke(tmp_path: Path) -> None:
    output = tmp_path / "tpu_train.json"
    stale = tmp_path / "work" / "save_dots-xla"  # an earlier call's run of the same configuration
    stale.mkdir(parents=True)
    record = {"step": 1, "loss": 1.0, "tokens_per_second": 1.0, "mfu": 0.5}
    (stale / "metrics.jsonl").write_text(
        "\n".join(json.dumps({**record, "step": step}) for step in (1, 2, 3))
    )
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tpu_train.py"), "--cpu-smoke", "--steps", "2",
         "--attention", "xla", "no-such-kernel", "--work-dir", str(tmp_path / "work"), "--output", str(output),
         "--", "--trainer.compilation_cache", "null"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert completed.returncode == 1, (
        completed.stdout[-3000:] + completed.stderr[-3000:]
    )  # the unknown kernel
    result = json.loads(output.read_text())
    assert result["jax"] and result["date"] and "--cpu-smoke" in result["command"]
    ok, failed = result["rows"]
    assert ok["status"] == "ok" and ok["attention"] == "xla", ok
    assert "--model.attention_implementation xla" in ok["train_command"]
    assert ok["train_command"].endswith("--trainer.compilation_cache null")  # after `--`: passed through
    assert ok["tokens_per_second"] > 1 and 0 < ok["mfu"] < 0.5 and ok["tokens_per_step"] == 4 * 64
    assert (
        failed["status"].startswith("failed (exit 2, 0 steps): error: ")
        and "no-such-kernel" in failed["status"]
    )
    assert "| save_dots | xla | 4 x 1 |" in output.with_suffix(".md").read_text()
