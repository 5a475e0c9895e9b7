"""Tiny runs for trainer tests: a 2-layer Llama on 30 standard-library files, shared token cache."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml

from halyard.models import LlamaConfig
from halyard.train.cli import main, resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.run_config import TrainConfig

TINY = {
    "model": {
        "type": "llama",
        "vocab_size": 512,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "max_position": 64,
    },
    "data": {
        "builtin_corpus": "python-stdlib",
        "max_documents": 30,
        "tokenizer_vocab_size": 512,
        "seq_len": 32,
        "num_workers": 0,
    },
    "optimizer": {"type": "adamw", "learning_rate": 0.01, "schedule": {"type": "cosine", "warmup": 2}},
    "trainer": {"steps": 6, "batch_size": 8, "log_every": 1, "progress": False, "plot": False},
    "checkpoint": {"every_steps": 2, "every_seconds": None, "keep_last": 10},
    "trackers": [{"type": "jsonl"}],
}


class StopAfter:
    """A preemption flag that asks to stop after ``steps`` steps (as SIGTERM would)."""

    exit_code = 143  # what the trainer exits with after saving, as for SIGTERM

    def __init__(self, steps: int) -> None:
        self.calls = 0
        self.steps = steps

    def requested_on_any_process(self) -> bool:
        self.calls += 1
        return self.calls >= self.steps


def deep_update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = (
            deep_update(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def write_config(path: Path, run_dir: Path, cache_dir: Path, **sections: dict[str, Any]) -> Path:
    """A tiny run's YAML at ``path`` with ``sections`` merged over `TINY`."""
    values = deep_update(TINY, {"trainer": {"run_dir": str(run_dir)}, "data": {"cache_dir": str(cache_dir)}})
    if sections.get("model", {}).get("type", "llama") != "llama":
        values["model"] = sections.pop("model")  # another family: its own fields, not the tiny Llama's
    values = deep_update(values, sections)
    path.write_text(yaml.safe_dump(values))
    return path


def load_config(path: Path, *overrides: str) -> TrainConfig:
    return parse_config(TrainConfig, resolve_config_paths(["--config", str(path), *overrides]))


def run_cli(
    args: list[str],
    *,
    devices: int = 8,
    timeout: float = 600,
    optimized: bool = False,
    native_isa: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess:
    """``train ARGS`` in a fresh Python process with ``devices`` simulated CPU devices.

    ``optimized``: XLA's backend optimisations on, as for users, instead of the tests' -O0
    (HALYARD_TEST_XLA_COMPILE_FLAGS). For runs whose programs run long (many steps, large logits): -O0
    compiles faster but its programs run up to twice as slow. ``native_isa``: the CPU's own instruction set, as
    for users, instead of the tests' cap without fused multiply-adds (the command sets what it needs itself).
    """
    compile_flags = "" if optimized else os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", "")
    dropped = ("--xla_cpu_max_isa=",) * native_isa
    compile_flags = " ".join(flag for flag in compile_flags.split() if not flag.startswith(dropped))
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {compile_flags}",
        JAX_PLATFORMS="cpu",
    )
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env, **popen
    )


def start_processes(args: list[str], *, processes: int = 2, devices: int = 2) -> list[subprocess.Popen]:
    """``train ARGS`` as one run of ``processes`` processes (gloo over localhost), ``devices`` CPU devices
    each; stdout and stderr are pipes."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = "import sys; from halyard.train.cli import train_main; sys.exit(train_main(sys.argv[1:]))"
    started = []
    for process_id in range(processes):
        env = dict(
            os.environ,
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
            JAX_PLATFORMS="cpu",
            HALYARD_COORDINATOR=f"127.0.0.1:{port}",
            HALYARD_NUM_PROCESSES=str(processes),
            HALYARD_PROCESS_ID=str(process_id),
        )
        started.append(
            subprocess.Popen(
                [sys.executable, "-c", code, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return started


def save_tiny_hf_llama(folder: Path) -> Path:
    """A seeded transformers Llama of the `TINY` shape, saved to ``folder`` with safetensors."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]


def assert_bitwise_equal(a: Any, b: Any) -> None:
    left, right = leaves(a), leaves(b)
    assert len(left) == len(right)
    for x, y in zip(left, right):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y), (
            f"max difference {np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))}"
        )


def fails(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """Run ``halyard ARGV`` in this process; return (exit code, stderr), checking the message is one line
    without a traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return int(raised.value.code), err


def run_losses(run_dir: Path) -> list[float]:
    """The training losses a run logged to ``run_dir/metrics.jsonl``, in step order."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def one_device_run(folder: Path, cache_dir: Path, **sections: dict[str, Any]) -> Path:
    """The tiny run with ``sections`` trained by `train` in a fresh 1-device process: the reference that
    runs on other meshes are compared with. Returns its run folder."""
    config = write_config(folder / "run.yaml", folder / "run", cache_dir, **sections)
    result = run_cli(["--config", str(config)], devices=1)
    assert result.returncode == 0, result.stderr[-2000:]
    return folder / "run"


def assert_trajectory_close(
    got: list[float], expected: list[float], *, model: dict[str, Any] | None = None, updates_before: int = 0
) -> None:
    """Each step's loss of a tiny run on another mesh (``got``) within summation order of the reference's.

    At first order: a step's loss is the forward pass (`decoder_terms`, the vocabulary's log-softmax, the
    batch's tokens) in another order, and every update before it adds one training step's differences
    (`training_terms` and the log-softmax), which carry into every later loss and add up (Adam's update is
    normalised: a gradient's rounding moves it by as little, relatively). So the bound grows linearly with the
    updates behind a loss: ``updates_before`` of them taken on another mesh before the first one compared
    (a checkpoint moved between meshes), then one more per step.

    Args:
        got: the run's losses, in step order.
        expected: the reference run's losses at the same steps.
        model: the run's ``model`` section over `TINY`'s (its ``num_layers``).
        updates_before: the updates behind the first compared loss that differ between the two runs.
    """
    # imported here: a run's subprocess imports test modules (a reward function's), without tests/support
    from float_tolerance import decoder_terms, summation_tolerance, training_terms

    fields = {**TINY["model"], **(model or {})}
    config = LlamaConfig(**{name: value for name, value in fields.items() if name != "type"})
    rows, length = TINY["trainer"]["batch_size"], TINY["data"]["seq_len"]
    forward = decoder_terms(config, length) + config.vocab_size + rows * length
    update = training_terms(config, rows, length) + config.vocab_size
    assert len(got) == len(expected), f"{len(got)} losses, {len(expected)} expected"
    for index, (loss, want) in enumerate(zip(got, expected, strict=True)):
        bound = summation_tolerance(want, forward + (updates_before + index) * update)
        np.testing.assert_allclose(loss, want, atol=bound, rtol=0, err_msg=f"loss {index + 1} of {len(got)}")
