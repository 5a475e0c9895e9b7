"""Every built-in config for real hardware trains two steps on CPU at smoke size, by overrides only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from halyard.train.cli import builtin_configs, main

HARDWARE_CONFIGS = ("gpt2-small", "gpt2-medium", "llama-1b", "llama-8b", "qwen2-0.5b")

# The smoke size: the shape shrinks, the family, layout, mesh, remat and precision stay the config's.
SMOKE_MODEL = {
    "gpt2": ["--model.num_heads", "4"],
    "llama": ["--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.head_dim", "8"],
    "qwen2": ["--model.num_heads", "4", "--model.num_kv_heads", "2"],
}


def _smoke_overrides(family: str, run_dir: Path, cache_dir: Path) -> list[str]:
    shape = ["--model.vocab_size", "512", "--model.hidden_size", "32", "--model.num_layers", "2"]
    if family != "gpt2":
        shape += ["--model.intermediate_size", "64"]
    data = ["--data.sources", "[]", "--data.builtin_corpus", "python-stdlib", "--data.max_documents", "30"]
    data += ["--data.tokenizer_vocab_size", "512", "--data.seq_len", "32", "--data.num_workers", "0"]
    data += ["--data.validation_fraction", "0", "--data.cache_dir", str(cache_dir)]
    trainer = ["--trainer.steps", "2", "--trainer.batch_size", "8", "--trainer.run_dir", str(run_dir)]
    trainer += ["--trainer.progress", "false", "--trainer.eval_every", "0", "--checkpoint.every_steps", "2"]
    trainer += ["--trainer.min_shard", "0"]  # shard even the tiny weights, as the full-size ones are
    return [*shape, *SMOKE_MODEL[family], *data, *trainer]


def test_the_hardware_configs_are_built_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(HARDWARE_CONFIGS) <= set(builtin_configs())
    assert main(["configs"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    for name in HARDWARE_CONFIGS:  # each with its one-line summary: size, layout, precision
        assert "parameters" in listed[name] and "bfloat16" in listed[name], listed[name]


# What each config chooses for accelerators, kept at smoke size: (layout, remat).
ACCELERATOR_CHOICES = {
    "gpt2-small": ("data_parallel", "save_dots"),
    "gpt2-medium": ("fsdp", "save_dots"),
    "llama-1b": ("fsdp", "save_dots"),
    "llama-8b": ("fsdp", "full"),
    "qwen2-0.5b": ("fsdp", "save_dots"),
}


def test_every_config_trains_at_smoke_size(tmp_path: Path) -> None:
    # One CPU device (a laptop's view), one process for all five: the imports are paid once.
    argv = {
        name: ["--config", name, *_smoke_overrides(_family(name), tmp_path / name, tmp_path / "cache")]
        for name in HARDWARE_CONFIGS
    }
    code = (
        "import json, sys; from halyard.train.cli import train_main\n"
        "for name, args in json.loads(sys.argv[1]).items():\n"
        "    print(f'config {name}', flush=True)\n"
        "    assert train_main(args) == 0, name\n"
    )
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
        JAX_PLATFORMS="cpu",
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("finished at step 2") == len(HARDWARE_CONFIGS), result.stdout[-3000:]
    for name in HARDWARE_CONFIGS:
        resolved = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert resolved["model"]["type"] == _family(name) and resolved["model"]["hidden_size"] == 32
        assert (resolved["model"]["param_dtype"], resolved["model"]["compute_dtype"]) == (
            "float32",
            "bfloat16",
        )
        assert (resolved["trainer"]["layout"], resolved["model"]["remat"]) == ACCELERATOR_CHOICES[name]


def _family(name: str) -> str:
    return "gpt2" if name.startswith("gpt2") else "qwen2" if name.startswith("qwen2") else "llama"
