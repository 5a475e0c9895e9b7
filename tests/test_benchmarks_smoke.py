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
