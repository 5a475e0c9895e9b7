"""Every family and variant: transformers -> Halyard -> transformers, logits and tensors compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import transformers
from hf_cases import CASES, assert_logits_close, halyard_logits, padded_batch, save, torch_logits
from safetensors.numpy import load_file

from halyard.export import export_hf, import_hf


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_matches_transformers_and_export_round_trips(case: str, tmp_path: Path) -> None:
    original = save(case, tmp_path / "hf")
    ids, attention_mask = padded_batch()
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    assert config.family == case.split("_")[0]
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=1e-4)

    export_hf(model, tmp_path / "exported")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(original)
    assert_logits_close(expected, torch_logits(reloaded, ids, attention_mask), attention_mask, atol=1e-4)

    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(after) == sorted(before)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and np.array_equal(after[key], tensor), key
