"""Smoke test of benchmarks/run_all.py --quick for train_step, scaling and hf_import (the other benchmarks have their
own smoke tests in their packages). Checks that the figures are produced and sane, never their speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_run_all_quick_train_step_scaling_hf_import(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--only", "train_step", "scaling", "hf_import",
         "--results-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    for label in (
        "Halyard / PyTorch tokens/s",
        "Halyard / plain JAX step time",
        "Halyard MFU",
        "FSDP / DP step time",
    ):
        assert label in output, output[-4000:]

    train = json.loads((tmp_path / "train_step.json").read_text())
    implementations = train["implementations"]
    assert set(implementations) == {"halyard", "plain_jax", "pytorch"}
    vocab = train["shapes"]["vocab_size"]
    for name, row in implementations.items():
        # Same init scale and random tokens: every implementation starts near the uniform loss ln(vocab).
        assert abs(row["first_loss"] - math.log(vocab)) < 0.1, (name, row["first_loss"])
        assert row["step_seconds_median"] > 0 and row["tokens_per_second"] > 0
    for name in ("halyard_over_pytorch_tokens_per_second", "halyard_over_plain_jax_step_time", "mfu"):
        assert math.isfinite(train["ratios"][name]) and train["ratios"][name] > 0, name
    shapes = train["shapes"]
    hidden, layers, seq = shapes["hidden_size"], shapes["num_layers"], shapes["seq_len"]
    # 6 N per token for the matmul weights (4 h^2 attention + 8 h^2 MLP per layer, tied output), plus attention.
    matmul_weights = layers * 12 * hidden * hidden + vocab * hidden
    expected_flops = 6 * matmul_weights * shapes["batch_size"] * seq
    assert expected_flops <= train["flops_per_step"] <= 1.5 * expected_flops

    scaling = json.loads((tmp_path / "scaling.json").read_text())
    # 8-way FSDP: each device holds about an eighth of params + AdamW moments (small vectors replicated).
    assert 0.125 <= scaling["ratios"]["fsdp_state_bytes_per_device_over_unsharded"] < 0.16
    assert (
        scaling["layouts"]["data_parallel"]["state_bytes_per_device"]
        == scaling["layouts"]["data_parallel"]["state_bytes_total"]
    )
    hf = json.loads((tmp_path / "hf_import.json").read_text())
    for step in ("import_sharded", "import_unsharded"):
        # Every imported byte is accounted for: the imported parameters are exactly the model's.
        assert hf["steps"][step]["imported_parameter_bytes"] == hf["model_bytes"]
        assert hf["steps"][step]["seconds"] > 0
    assert math.isfinite(hf["ratios"]["sharded_import_transient_over_largest_tensor"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {run["status"] for run in summary["runs"].values()} == {"ok"}


def test_train_step_quick_large_vocabulary_llama(tmp_path: Path) -> None:
    output = tmp_path / "train_step_llama_49k.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "training" / "train_step.py"), "--quick", "--model", "llama-49k",
         "--rounds", "1", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    train = json.loads(output.read_text())
    assert train["model"] == "llama-49k"
    assert set(train["implementations"]) == {"halyard", "plain_jax", "pytorch"}
    shapes = train["shapes"]
    vocab, hidden, layers = shapes["vocab_size"], shapes["hidden_size"], shapes["num_layers"]
    for name, row in train["implementations"].items():
        # HF initialisation (std 0.02) and random tokens: every implementation starts near ln(vocab).
        assert abs(row["first_loss"] - math.log(vocab)) < 0.1, (name, row["first_loss"])
    head = hidden // shapes["num_heads"]
    attention = hidden * head * (2 * shapes["num_heads"] + 2 * shapes["num_kv_heads"])
    matmul_weights = layers * (attention + 3 * hidden * shapes["intermediate_size"]) + vocab * hidden
    expected_flops = 6 * matmul_weights * shapes["batch_size"] * shapes["seq_len"]
    assert expected_flops <= train["flops_per_step"] <= 1.5 * expected_flops
    assert math.isfinite(train["ratios"]["halyard_over_pytorch_tokens_per_second"])


def test_gpu_sh_cpu_smoke(tmp_path: Path) -> None:
    # The GPU benchmark's own code path at tiny size: the batch search's compile and memory check (one
    # compile: --max-batch 1 keeps the suite quick), timed steps, MFU, a cuDNN row skipped on CPU, tables.
    output = tmp_path / "gpu_llama.json"
    completed = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "training" / "gpu.sh"), "--cpu-smoke", "--remat", "save_dots",
         "--attention", "xla", "cudnn", "--max-batch", "1", "--output", str(output)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-4000:]
    result = json.loads(output.read_text())
    assert result["cpu_smoke"] is True and result["seq_len"] == 64
    rows = {(row["remat"], row["attention"]): row for row in result["rows"]}
    assert set(rows) == {("save_dots", "xla"), ("save_dots", "cudnn")}
    assert rows["save_dots", "cudnn"]["status"].startswith("skipped: cuDNN attention needs an NVIDIA GPU")
    xla = rows["save_dots", "xla"]
    assert xla["status"] == "ok" and xla["batch_size"] == 1
    assert xla["planned_bytes"] <= result["memory_limit_bytes"]
    assert abs(xla["first_loss"] - math.log(512)) < 0.2  # random tokens, std-0.02 init: ~ln(vocab)
    assert xla["mfu"] > 0 and xla["tokens_per_second"] == 64 / xla["step_seconds_median"]
    assert "| save_dots | xla | 1 |" in output.with_suffix(".md").read_text()
