"""A family's checkpoint both ways, for the ``test_family_*_export.py`` files: a random-init transformers
model saved from a ``config.json`` dict, imported (transformers' logits), exported and reloaded by
transformers (the same logits, the same tensors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from hf_cases import assert_logits_close, halyard_logits, padded_batch, referee_tolerance, torch_logits
from safetensors.numpy import load_file

from halyard.export import export_hf, import_hf, read_hf_config
from halyard.models import ModelConfig


def saved_checkpoint(hf: dict[str, Any], folder: Path) -> Any:
    """A random-init transformers model of the ``config.json`` keys ``hf`` (``model_type`` picks the class),
    saved in ``folder`` with ``hf`` itself as its config.json. Every norm weight is moved by up to 0.5 from
    its initial value (transformers initialises them all alike), so that a misplaced norm shows."""
    config = transformers.CONFIG_MAPPING[hf["model_type"]].from_dict(hf)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().float()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.empty_like(parameter).uniform_(-0.5, 0.5))
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    return model


def check_both_ways(hf: dict[str, Any], tmp_path: Path) -> ModelConfig:
    """Import the `saved_checkpoint` of ``hf`` and compare with transformers' logits on a padded batch, then
    export it, reload it in transformers and compare logits and every tensor; returns the Halyard config.

    Raises:
        AssertionError: logits further apart than `referee_tolerance` (transformers' reloaded: at all), another config read back, or changed tensors.
    """
    original = saved_checkpoint(hf, tmp_path / "hf")
    ids, attention_mask = padded_batch(vocab=hf["vocab_size"])
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "exported")
    assert read_hf_config(tmp_path / "exported")[0] == config
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(original)
    # the same transformers model on the same tensors (compared below): the same program
    assert_logits_close(expected, torch_logits(reloaded, ids, attention_mask), attention_mask, atol=0)
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(after[key], before[key]) for key in before)
    return config
