"""How `import_hf` brings weights onto the device: no XLA program compiled for it (every parameter is read into
host memory, then all are put on the device in one ``jax.device_put``, the values bit for bit the exported
ones), and weights read from a memory-mapped pickle are arrays of their own, not views of the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import torch

from halyard.export import export_hf, import_hf
from halyard.export.sources import TorchPickleSource
from halyard.models import ModelConfig, init_model, model_config

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def tiny_llama() -> ModelConfig:
    return model_config(
        "llama",
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
    )


def test_importing_a_folder_compiles_nothing_and_keeps_every_bit(tmp_path: Path) -> None:
    model = init_model(tiny_llama().replace(param_dtype="bfloat16"), jax.random.key(0))
    export_hf(model, tmp_path / "model", dtype="bfloat16")
    compiles: list[str] = []

    def record(event: str, duration_secs: float, **_: object) -> None:
        if event == _COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(record)
    try:
        _, imported = import_hf(tmp_path / "model", dtype="bfloat16")
        jax.block_until_ready(imported)
    finally:
        jax.monitoring.unregister_event_duration_listener(record)
    assert compiles == []  # jnp.asarray compiled a conversion program for each shape and dtype
    for got, want in zip(jax.tree.leaves(imported), jax.tree.leaves(model), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


def test_a_pickled_checkpoints_blocks_are_not_views_of_the_mapped_file(tmp_path: Path) -> None:
    weights = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    torch.save(weights, tmp_path / "pytorch_model.bin")
    source = TorchPickleSource(tmp_path)
    block = source.read("w", (slice(None), slice(None)))
    np.testing.assert_array_equal(block, weights["w"].numpy())
    assert not np.shares_memory(block, source._tensors["w"].numpy())


READ_TO_HOST = """
import sys
import numpy as np
from jax._src import xla_bridge
from halyard.export.importer import read_hf_to_host
_, model = read_hf_to_host(sys.argv[1], dtype="bfloat16")
import jax
kinds = {type(leaf).__name__ for leaf in jax.tree.leaves(model)}
print(kinds, xla_bridge.backends_are_initialized())
"""


def test_reading_a_folder_into_host_memory_starts_no_backend(tmp_path: Path) -> None:
    """What lets ``halyard serve`` read a folder while JAX's backend starts in another thread (issue 53)."""
    export_hf(init_model(tiny_llama(), jax.random.key(0)), tmp_path / "model", dtype="bfloat16")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-c", READ_TO_HOST, str(tmp_path / "model")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["{'ndarray'}", "False"], done.stdout + done.stderr[-3000:]
