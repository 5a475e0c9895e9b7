"""benchmarks/tpu/tpu_train.py --cpu-smoke: the TPU benchmark's code at tiny size on CPU (figures produced and
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
        [sys.executable, str(ROOT / "benchmarks" / "tpu" / "tpu_train.py"), "--cpu-smoke", "--steps", "2",
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


def test_the_tpu_driver_names_its_parts_and_runs_one(tmp_path: Path) -> None:
    """benchmarks/tpu/run.sh, the chip's one entry point: every preset is made of its parts, a part runs and
    logs under OUT (here `machine`, on this CPU, installing nothing), an unknown name is refused."""
    driver = ["bash", str(ROOT / "benchmarks" / "tpu" / "run.sh"), "none", str(tmp_path / "out")]
    listed = subprocess.run([*driver, "--list"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert listed.returncode == 0, listed.stderr
    parts = {line.split(":")[0].strip() for line in listed.stdout.split("presets:")[0].splitlines()[1:]}
    presets = dict(
        line.strip().split(": ") for line in listed.stdout.split("presets:")[1].strip().splitlines()
    )
    assert set(presets) == {"check", "suite", "final", "decode-kernel", "pallas-engine"}
    assert {part for names in presets.values() for part in names.split()} <= parts
    ran = subprocess.run([*driver, "machine"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ran.returncode == 0 and "=== machine" in ran.stdout and "jax" in ran.stdout, ran.stderr
    assert (tmp_path / "out" / "machine.vllm_check.txt").exists() and (tmp_path / "out" / "log.txt").exists()
    refused = subprocess.run([*driver, "no-such-part"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "unknown part 'no-such-part'" in refused.stderr
