"""Phi-3 through halyard.export: a transformers checkpoint (fused qkv_proj and gate_up_proj, longrope past
the pre-training length, partial rotary, a window) imported and exported back (logits and tensors), a
longrope model made in Halyard exported for transformers, and the options Phi3ForCausalLM cannot hold
refused."""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
import torch
import transformers
from hf_cases import (
    SEQ,
    VOCAB,
    assert_logits_close,
    count_reads,
    halyard_logits,
    padded_batch,
    referee_tolerance,
    torch_logits,
)
from safetensors.numpy import load_file

from halyard.export import UnsupportedModelError, export_hf, import_hf, read_hf_config
from halyard.models import Phi3Config, init_model
from halyard.models.rotary import RotaryConfig
from halyard.shard import Layout, MeshSpec

ORIGINAL = SEQ - 4  # the test batch is longer: the long factors rotate it
SHORT_FACTOR = (1.0, 1.2, 1.7, 2.5)  # 16-channel heads, half of them rotating: 4 pairs
LONG_FACTOR = (1.5, 3.0, 6.0, 11.0)
# GQA with 16-channel heads, a window (5 < the 12-token batch), untied embeddings
HF_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=ORIGINAL,
    partial_rotary_factor=0.5, sliding_window=5, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, rope_scaling=dict(type="longrope", short_factor=list(SHORT_FACTOR), long_factor=list(LONG_FACTOR)),
)  # fmt: skip


def _saved_checkpoint(folder: Path) -> transformers.Phi3ForCausalLM:
    config = transformers.Phi3Config(**HF_CONFIG)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(config).eval().float()
    with torch.no_grad():  # norms away from their initial ones, so that a misplaced norm weight shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model


def _reloaded(folder: Path) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert type(model) is transformers.Phi3ForCausalLM
    return model


def test_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    original = _saved_checkpoint(tmp_path / "hf")
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    assert isinstance(config, Phi3Config)
    assert (config.rope.scaling, config.rope.original_max_position) == ("longrope", ORIGINAL)
    assert config.sliding_window == 5
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "exported")
    assert read_hf_config(tmp_path / "exported")[0] == config
    reloaded = _reloaded(tmp_path / "exported")
    # the same transformers model on the same tensors: the same program
    assert_logits_close(expected, torch_logits(reloaded, ids, attention_mask), attention_mask, atol=0)
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(after) == sorted(before) and "model.layers.1.self_attn.qkv_proj.weight" in after
    assert all(np.array_equal(after[key], before[key]) for key in before)


def test_fsdp_tensor_import_reads_each_slice_once_and_exports_the_fused_tensors_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    _saved_checkpoint(tmp_path / "hf")
    _, plain = import_hf(tmp_path / "hf")
    reads = count_reads(monkeypatch)
    mesh = MeshSpec(data=1, fsdp=4, tensor=2).build()
    _, sharded = import_hf(tmp_path / "hf", layout=Layout.fsdp_tensor(min_shard=1), mesh=mesh)
    k_proj = sharded.layers.stacked.attention.k_proj.weight.array  # type: ignore[attr-defined]
    assert len({str(shard.index) for shard in k_proj.addressable_shards}) == 8  # embed and kv_heads split
    for left, right in zip(jax.tree.leaves(plain), jax.tree.leaves(sharded)):
        unpadded = tuple(slice(size) for size in left.shape)  # the vocabulary is padded to 98 for the mesh
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right)[unpadded])
    # q, k and v each read their rows of the fused tensor, every element once over the 8 devices
    assert reads["model.layers.0.self_attn.qkv_proj.weight"] == (4 + 2 + 2) * 16 * 64
    assert reads["model.layers.0.mlp.gate_up_proj.weight"] == 2 * 48 * 64

    export_hf(sharded, tmp_path / "exported", vocab_size=VOCAB)  # the padding cut
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(after[key], before[key]) for key in before)


def test_a_longrope_model_made_in_halyard_exports_for_transformers(tmp_path: Path) -> None:
    rope = RotaryConfig(
        scaling="longrope", short_factor=SHORT_FACTOR, long_factor=LONG_FACTOR, original_max_position=ORIGINAL,
        partial_rotary_factor=0.5,
    )  # fmt: skip
    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=4,
        max_position=64, rope=rope, sliding_window=None, tie_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    model = init_model(config, jax.random.key(0))
    export_hf(model, tmp_path / "exported")
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    # transformers' Phi3Config takes the pre-training length from the top level (4096 when absent)
    assert written["original_max_position_embeddings"] == ORIGINAL
    ids, attention_mask = padded_batch()
    expected = halyard_logits(model, ids, attention_mask)
    reloaded = torch_logits(_reloaded(tmp_path / "exported"), ids, attention_mask)
    assert_logits_close(expected, reloaded, attention_mask, atol=referee_tolerance(config, expected))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(attention_bias=True), "attention_bias=True, which Hugging Face's Phi3ForCausalLM cannot"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (dict(sliding_window=4, full_attention_layers=1), "full_attention_layers=1.*qwen2"),
        (dict(rope=RotaryConfig(scaling="llama3", factor=8.0)), "rope.scaling='llama3'"),
    ],
)
def test_options_phi3_cannot_hold_are_refused(options: dict, message: str, tmp_path: Path) -> None:
    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position=64, **options,
    )  # fmt: skip
    abstract = eqx.filter_eval_shape(config.init, jax.random.key(0))  # refused before any array is read
    with pytest.raises(UnsupportedModelError, match=message):
        export_hf(abstract, tmp_path / "exported")
    assert not (tmp_path / "exported").exists()
