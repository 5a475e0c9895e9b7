"""Export writes each safetensors file tensor by tensor: byte-identical to `safetensors.numpy.save_file`.

The reference file is ``save_file`` of the original transformers checkpoint's tensors (rounded to the
export dtype), so these tests check both the file format and every value, for unsharded and sharded
models, a padded vocabulary, GPT-2's fused ``c_attn`` and Mixtral's per-expert tensors.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
from hf_cases import VOCAB, save
from safetensors.numpy import load_file, save_file

import halyard.export.safetensors_writing as safetensors_writing
from halyard.export import export_hf, import_hf
from halyard.export.safetensors_writing import safetensors_header, write_safetensors
from halyard.shard import Layout, MeshSpec


def _original_tensors(folder: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _reference_bytes(tensors: dict[str, np.ndarray], keys: list[str], dtype: Any, path: Path) -> bytes:
    save_file({key: tensors[key].astype(dtype) for key in keys}, str(path), metadata={"format": "pt"})
    return path.read_bytes()


def _assert_files_equal_save_file(original: Path, exported: Path, dtype: Any, scratch: Path) -> None:
    tensors = _original_tensors(original)
    files = sorted(exported.glob("*.safetensors"))
    exported_keys: set[str] = set()
    for file in files:
        keys = list(load_file(file))
        exported_keys.update(keys)
        expected = _reference_bytes(tensors, keys, dtype, scratch / file.name)
        assert file.read_bytes() == expected, f"{file.name} differs from save_file of the same tensors"
    tied = (
        {"lm_head.weight"}
        if json.loads((original / "config.json").read_text()).get("tie_word_embeddings")
        else set()
    )
    assert exported_keys == set(tensors) - tied


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ("gpt2", "float32"),
        ("mixtral", "float32"),
        ("llama_gqa_tied", "bfloat16"),
        ("qwen2_qkv_bias", "float32"),
    ],
)
def test_unsharded_export_is_byte_identical_to_save_file(case: str, dtype: str, tmp_path: Path) -> None:
    save(case, tmp_path / "hf")
    _, model = import_hf(tmp_path / "hf")
    export_hf(model, tmp_path / "out", dtype=dtype)
    numpy_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    (tmp_path / "scratch").mkdir()
    _assert_files_equal_save_file(tmp_path / "hf", tmp_path / "out", numpy_dtype, tmp_path / "scratch")


@pytest.mark.parametrize(
    ("case", "layout"),
    [
        ("gpt2", Layout.fsdp(min_shard=1)),
        ("llama_mha_untied", Layout({"vocab": "fsdp"}, min_shard=1)),  # 97 rows padded to 104, cut back
        ("mixtral", Layout.fsdp(min_shard=1)),
    ],
)
def test_sharded_export_in_several_files_is_byte_identical_to_save_file(
    case: str, layout: Layout, tmp_path: Path
) -> None:
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    save(case, tmp_path / "hf")
    _, model = import_hf(tmp_path / "hf", layout=layout, mesh=MeshSpec(data=1, fsdp=8).build())
    export_hf(model, tmp_path / "out", max_shard_bytes=16 * 1024, vocab_size=VOCAB)
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    (tmp_path / "scratch").mkdir()
    _assert_files_equal_save_file(tmp_path / "hf", tmp_path / "out", np.float32, tmp_path / "scratch")


def test_accelerator_path_slices_each_block_on_the_device_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On an accelerator a device block is sliced to the wanted layer before it is copied to the host;
    # forcing that path on the simulated CPU devices checks it gives the same file.
    monkeypatch.setattr("halyard.export.tensor_gathering.host_view_is_free", lambda device: False)
    save("mixtral", tmp_path / "hf")
    layout = Layout({"vocab": "fsdp", "embed": "fsdp"}, min_shard=1)
    _, model = import_hf(tmp_path / "hf", layout=layout, mesh=MeshSpec(data=1, fsdp=8).build())
    export_hf(model, tmp_path / "out", vocab_size=VOCAB)
    (tmp_path / "scratch").mkdir()
    _assert_files_equal_save_file(tmp_path / "hf", tmp_path / "out", np.float32, tmp_path / "scratch")


def test_export_holds_one_tensor_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save("llama_gqa_tied", tmp_path / "hf")
    _, model = import_hf(tmp_path / "hf")
    produced: list[weakref.ref[np.ndarray]] = []
    original_write = safetensors_writing.write_safetensors

    def watching_write(path: Any, shapes: Any, dtype: Any, produce: Any, metadata: Any = None) -> None:
        def watched(name: str) -> np.ndarray:
            assert all(ref() is None for ref in produced), "an earlier tensor is still alive"
            tensor = produce(name)
            produced.append(weakref.ref(tensor))
            return tensor

        original_write(path, shapes, dtype, watched, metadata)

    monkeypatch.setattr("halyard.export.exporter.write_safetensors", watching_write)
    export_hf(model, tmp_path / "out")
    assert len(produced) == len(_original_tensors(tmp_path / "hf"))  # every tensor, each once


def test_write_safetensors_matches_save_file_and_checks_what_it_is_given(tmp_path: Path) -> None:
    tensors = {
        "b.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a.10": np.full((3,), 2.5, np.float32),
        "a.2": np.zeros((0, 4), np.float32),
        "ü": np.ones((1,), np.float32),
    }
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    shapes = {name: tensor.shape for name, tensor in tensors.items()}
    write_safetensors(
        tmp_path / "mine.safetensors", shapes, np.float32, tensors.__getitem__, {"format": "pt"}
    )
    assert (tmp_path / "mine.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()

    header, order = safetensors_header(shapes, np.dtype(np.float32))
    assert order == ["a.10", "a.2", "b.weight", "ü"] and len(header) % 8 == 0
    with pytest.raises(ValueError, match="'a.10' is float32\\[4\\], the header says float32\\[3\\]"):
        write_safetensors(
            tmp_path / "bad.safetensors", shapes, np.float32, lambda name: np.zeros(4, np.float32)
        )
    with pytest.raises(ValueError, match="cannot write dtype float16"):
        safetensors_header(shapes, np.dtype(np.float16))
