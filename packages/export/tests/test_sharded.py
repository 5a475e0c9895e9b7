"""Sharded safetensors both ways, bfloat16 export, and import straight into an 8-device FSDP layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import hf_cases
import jax
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from float_tolerance import decoder_terms, summation_tolerance
from hf_cases import VOCAB, assert_logits_close, count_reads, halyard_logits, padded_batch, save, torch_logits
from safetensors.numpy import load_file

from halyard.export import export_hf, import_hf
from halyard.named import is_named
from halyard.shard import Layout, MeshSpec


def _all_tensors(folder: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _named_arrays(model: object) -> list[np.ndarray]:
    leaves = jax.tree_util.tree_leaves(model, is_leaf=is_named)
    return [np.asarray(jax.device_get(leaf.array)) for leaf in leaves]


def test_sharded_safetensors_import_and_export(tmp_path: Path) -> None:
    original = save("llama_gqa_tied", tmp_path / "hf", max_shard_size="20KB")
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "transformers wrote a single file"
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    atol = hf_cases.referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "out", max_shard_bytes=8 * 1024)
    written = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    assert len(files) > 2 and sorted(set(written["weight_map"].values())) == files
    assert not (tmp_path / "out" / "model.safetensors").exists()
    sizes = [p.stat().st_size for p in (tmp_path / "out").glob("*.safetensors")]
    largest_tensor = max(t.nbytes for t in _all_tensors(tmp_path / "hf").values())
    assert max(sizes) <= max(8 * 1024, largest_tensor) + 4096  # + the safetensors header
    assert written["metadata"]["total_size"] == sum(t.nbytes for t in _all_tensors(tmp_path / "out").values())

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    )
    # the same transformers model on the same tensors (compared below): the same program
    assert_logits_close(expected, torch_logits(reloaded.eval(), ids, attention_mask), attention_mask, atol=0)
    before, after = _all_tensors(tmp_path / "hf"), _all_tensors(tmp_path / "out")
    assert sorted(before) == sorted(after)
    assert all(np.array_equal(before[key], after[key]) for key in before)


@pytest.mark.parametrize("case", ["gpt2", "mixtral"])
def test_bfloat16_export_loads_with_logits_within_bf16_tolerance(case: str, tmp_path: Path) -> None:
    original = save(case, tmp_path / "hf")
    _, model = import_hf(tmp_path / "hf")
    export_hf(model, tmp_path / "bf16", dtype="bfloat16")
    stored = load_file(tmp_path / "bf16" / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {np.dtype(ml_dtypes.bfloat16)}
    for key, tensor in original.state_dict().items():
        if key in stored:  # the tied lm_head is not stored
            rounded = tensor.detach().to(torch.bfloat16).float().numpy()
            np.testing.assert_array_equal(stored[key].astype(np.float32), rounded, err_msg=key)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "bf16", attn_implementation="eager"
    )
    assert next(reloaded.parameters()).dtype == torch.bfloat16
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)
    actual = torch_logits(reloaded.eval(), ids, attention_mask)
    scale = np.abs(expected).max()
    assert_logits_close(expected, actual, attention_mask, atol=0.03 * scale)
    assert np.abs(expected - actual).max() > 0  # the weights really are rounded


def test_fsdp_import_on_8_devices_equals_unsharded_and_reads_only_each_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    save("llama_mha_untied", tmp_path / "hf")
    _, plain = import_hf(tmp_path / "hf")

    reads = count_reads(monkeypatch)
    mesh = MeshSpec(data=1, fsdp=8).build()
    layout = Layout.fsdp(min_shard=1)
    config, sharded = import_hf(tmp_path / "hf", layout=layout, mesh=mesh)
    assert config.vocab_size == VOCAB  # embed (32) carries the fsdp split, the vocabulary needs no padding

    for left, right in zip(_named_arrays(plain), _named_arrays(sharded)):
        np.testing.assert_array_equal(left, right)
    q_proj = sharded.layers.stacked.attention.q_proj.weight.array
    assert q_proj.sharding.spec[1] == "fsdp" and len({str(s.index) for s in q_proj.addressable_shards}) == 8
    # each device read its own eighth: the tensor's elements were read once in all, not once per device
    assert reads["model.layers.0.self_attn.q_proj.weight"] == 32 * 32
    ids, attention_mask = padded_batch()
    # the same weights bit for bit (above); fsdp's gathered products may add their terms in another order
    expected = halyard_logits(plain, ids, attention_mask)
    atol = summation_tolerance(expected, decoder_terms(config, ids.shape[1]))
    np.testing.assert_allclose(halyard_logits(sharded, ids, attention_mask), expected, atol=atol, rtol=0)


def test_vocabulary_padded_for_the_mesh_and_cut_on_export(tmp_path: Path) -> None:
    original = save("qwen2_qkv_bias", tmp_path / "hf")
    mesh = MeshSpec(data=1, fsdp=8).build()
    layout = Layout({"vocab": "fsdp"}, min_shard=1)  # only the vocabulary is split: 97 must be padded
    config, model = import_hf(tmp_path / "hf", layout=layout, mesh=mesh)
    assert config.vocab_size == math.ceil(VOCAB / 8) * 8 == 104
    embedding = np.asarray(jax.device_get(model.embed.weight.array))
    np.testing.assert_array_equal(embedding[VOCAB:], 0.0)
    np.testing.assert_array_equal(embedding[:VOCAB], original.model.embed_tokens.weight.detach().numpy())
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)
    atol = hf_cases.referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "out", vocab_size=VOCAB)
    before, after = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "out" / "model.safetensors"),
    )
    assert sorted(before) == sorted(after) and all(np.array_equal(before[k], after[k]) for k in before)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == VOCAB


def test_import_converts_the_dtype(tmp_path: Path) -> None:
    original = save("mistral_sliding_window", tmp_path / "hf")
    config, model = import_hf(tmp_path / "hf", dtype="bfloat16")
    assert config.param_dtype == "bfloat16"
    weight = model.layers.stacked.mlp.up.weight.array
    assert weight.dtype == np.dtype(ml_dtypes.bfloat16)
    stored = original.model.layers[1].mlp.up_proj.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(weight[1]).astype(np.float32), stored.T)
