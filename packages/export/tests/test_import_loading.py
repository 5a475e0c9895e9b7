"""How `import_hf` brings weights onto the device: no XLA program compiled for it (each parameter is put on the
device as it is read, the values bit for bit the exported ones), and weights read from a memory-mapped pickle
are arrays of their own, not views of the file."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import torch

from halyard.export import export_hf, import_hf
from halyard.export.sources import TorchPickleSource
from halyard.models import init_model, model_config

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def test_importing_a_folder_compiles_nothing_and_keeps_every_bit(tmp_path: Path) -> None:
    config = model_config(
        "llama",
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
    )
    model = init_model(config.replace(param_dtype="bfloat16"), jax.random.key(0))
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
