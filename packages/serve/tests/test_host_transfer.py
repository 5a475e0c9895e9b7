"""The TPU runtime's host buffer sized from a folder's safetensors headers, and weights put in groups that fit
it (`halyard.serve.server.host_transfer`). `test_server_backend_start.py` checks that ``halyard-serve --hf``
sets the size before the runtime starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from halyard.serve.server import host_transfer
from halyard.serve.server.host_transfer import (
    BUFFER_ENV,
    THRESHOLD_ENV,
    buffer_bytes_for,
    largest_tensor_bytes,
    put_in_groups,
    size_host_buffer,
    size_premapped_buffer,
    transfer_limit,
)

MiB = 2**20


def sharded_folder(folder: Path) -> Path:
    """Two shards and their index: the largest tensor is 30 x 30 float16 (1,800 bytes as stored)."""
    folder.mkdir(parents=True)
    save_file({"a": np.zeros((10, 20), np.float32)}, str(folder / "one.safetensors"))
    save_file(
        {"b": np.zeros((30, 30), np.float16), "c": np.zeros(3, np.int64)}, str(folder / "two.safetensors")
    )
    weight_map = {"a": "one.safetensors", "b": "two.safetensors", "c": "two.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def test_the_buffer_is_the_next_power_of_two_between_256_MiB_and_4_GiB() -> None:
    assert buffer_bytes_for(0) == 256 * MiB
    assert buffer_bytes_for(256 * MiB) == 256 * MiB
    assert buffer_bytes_for(272_000_000) == 512 * MiB  # Qwen2.5-0.5B's embedding in bfloat16
    assert buffer_bytes_for(600 * MiB) == 1024 * MiB
    assert buffer_bytes_for(9 * 2**30) == 4 * 2**30  # larger than the default: the default


def test_a_size_set_in_the_environment_is_kept() -> None:
    environ: dict[str, str] = {}
    assert size_premapped_buffer(300 * MiB, environ) == 512 * MiB
    assert environ == {BUFFER_ENV: str(512 * MiB)}
    environ = {BUFFER_ENV: "123"}
    assert size_premapped_buffer(300 * MiB, environ) == 123
    assert environ == {BUFFER_ENV: "123"}


def test_the_largest_tensor_is_read_from_every_shard_in_the_served_dtype(tmp_path: Path) -> None:
    folder = sharded_folder(tmp_path / "sharded")
    assert largest_tensor_bytes(folder, "auto") == 1800  # float16 kept
    assert largest_tensor_bytes(folder, "float32") == 3600
    assert largest_tensor_bytes(folder, "bfloat16") == 1800
    single = tmp_path / "single"
    single.mkdir()
    save_file({"w": np.zeros((7, 5), np.float32)}, str(single / "model.safetensors"))
    assert largest_tensor_bytes(single, "auto") == 140
    assert largest_tensor_bytes(single, "bfloat16") == 70


def test_a_folder_that_cannot_be_sized_keeps_the_runtimes_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BUFFER_ENV, raising=False)
    assert size_host_buffer(tmp_path) is None  # no weights
    (tmp_path / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert size_host_buffer(tmp_path) is None  # a damaged header
    (tmp_path / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"{nope")
    assert size_host_buffer(tmp_path) is None
    assert BUFFER_ENV not in os.environ


def test_a_folder_sizes_the_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BUFFER_ENV, raising=False)
    assert size_host_buffer(sharded_folder(tmp_path / "m")) == 256 * MiB
    assert os.environ[BUFFER_ENV] == str(256 * MiB)


def test_weights_go_in_groups_that_fit_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = {
        "a": np.arange(10, dtype=np.float32),  # 40 bytes
        "b": np.arange(20, dtype=np.float32),  # 80
        "c": np.arange(30, dtype=np.float32),  # 120: alone, over the limit
        "d": np.arange(5, dtype=np.float32),  # 20
    }
    groups: list[int] = []
    device_put = jax.device_put

    def recorded(leaves: list[np.ndarray]) -> list[jax.Array]:
        groups.append(sum(leaf.nbytes for leaf in leaves))
        return device_put(leaves)

    monkeypatch.setattr(host_transfer.jax, "device_put", recorded)
    placed = put_in_groups(tree, 100)
    assert groups == [40, 80, 120, 20]
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(placed))
    for key, leaf in tree.items():
        np.testing.assert_array_equal(np.asarray(placed[key]), leaf)
    groups.clear()
    put_in_groups(tree, 130)
    assert groups == [120, 120, 20]


def test_on_a_tpu_a_transfer_is_limited_by_the_buffer_and_its_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert transfer_limit({BUFFER_ENV: "1024"}) is None  # this CPU: no limit
    monkeypatch.setattr(host_transfer.jax, "default_backend", lambda: "tpu")
    assert transfer_limit({}) == 4 * 2**30  # libtpu's default
    assert transfer_limit({BUFFER_ENV: "1024"}) == 1024
    assert transfer_limit({BUFFER_ENV: "1024", THRESHOLD_ENV: "512"}) == 512
