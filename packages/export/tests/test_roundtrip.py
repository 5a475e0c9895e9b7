"""Every family and variant: transformers -> Halyard -> transformers, logits and tensors compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import transformers
from hf_cases import (
    CASES,
    assert_logits_close,
    halyard_logits,
    padded_batch,
    referee_tolerance,
    save,
    torch_logits,
)
from safetensors.numpy import load_file, save_file

from halyard.export import export_hf, import_hf, read_hf_config


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_matches_transformers_and_export_round_trips(case: str, tmp_path: Path) -> None:
    original = save(case, tmp_path / "hf")
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    assert config.family == case.split("_")[0]
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "exported")
    assert read_hf_config(tmp_path / "exported")[0] == config  # config.json written as it was read
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(original)
    # the same transformers model on the same tensors (compared below): the same program
    assert_logits_close(expected, torch_logits(reloaded, ids, attention_mask), attention_mask, atol=0)

    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(after) == sorted(before)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and np.array_equal(after[key], tensor), key


def test_gpt2_checkpoint_in_the_original_layout(tmp_path: Path) -> None:
    """The oldest GPT-2 files have no ``transformer.`` prefix and store the causal-mask buffers."""
    original = save("gpt2", tmp_path / "hf")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    renamed = {key.removeprefix("transformer."): value for key, value in tensors.items()}
    for layer in range(2):
        renamed[f"h.{layer}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    renamed["lm_head.weight"] = tensors["transformer.wte.weight"]  # stored although tied: must be equal
    save_file(renamed, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    ids, attention_mask = padded_batch()
    config, model = import_hf(tmp_path / "hf")
    expected = torch_logits(original, ids, attention_mask)
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)
