"""Every accepted real config, shrunk (`hf_corpus.shrink`), computes what transformers computes.

For each shrunk config: a random-init transformers model built from it, saved with the shrunk real
``config.json`` (not transformers' re-serialisation), imported, and compared on a padded batch (float32,
max abs difference within `referee_tolerance`); then exported and reloaded by transformers, with the same logits and EOS ids.
This is what shows that an accepted key is really implemented. Configs that shrink to the same
computation (the same values of the keys the family's rule implements or fixes, and the same Halyard
config) are tested once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_cases import assert_logits_close, halyard_logits, padded_batch, referee_tolerance, torch_logits
from hf_corpus import CONFIG_CLASSES, VOCAB, accepted_entries, load, shrink, without_model_code

from halyard.export import export_hf, import_hf, read_hf_config
from halyard.export.config_reading import config_from_hf_dict
from halyard.models.hf import hf_family

# Keys that do not reach the forward pass once the weights are given
_NOT_COMPUTED = {"bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "architectures"}


def _computation(family: str, small: dict[str, Any]) -> str:
    """What decides the logits of a shrunk config, as transformers and Halyard read it."""
    rule = hf_family(family).rule
    theirs = CONFIG_CLASSES[family].from_dict(small).to_dict()
    decided = {
        key: value
        for key, value in theirs.items()
        if key in rule.implemented | set(rule.fixed) and key not in _NOT_COMPUTED
    }
    ours = config_from_hf_dict(small)[0].replace(eos_token_ids=())
    return json.dumps([family, decided, repr(ours)], sort_keys=True, default=str)


def _distinct_cases() -> list[tuple[str, list[str]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in accepted_entries():
        groups.setdefault(_computation(entry["family"], shrink(load(entry), entry["family"])), []).append(
            entry
        )
    return [(group[0]["file"], [e["file"] for e in group]) for group in groups.values()]


CASES = _distinct_cases()


def _build(family: str, small: dict[str, Any], folder: Path) -> Any:
    config = CONFIG_CLASSES[family].from_dict(small)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().float()
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(small, indent=2))  # the real keys, shrunk
    return model


def _check_both_ways(family: str, small: dict[str, Any], tmp_path: Path) -> None:
    original = _build(family, small, tmp_path / "hf")
    ids, attention_mask = padded_batch(vocab=VOCAB)
    expected = torch_logits(original, ids, attention_mask)

    config, model = import_hf(tmp_path / "hf")
    atol = referee_tolerance(config, expected)
    assert_logits_close(expected, halyard_logits(model, ids, attention_mask), attention_mask, atol=atol)

    export_hf(model, tmp_path / "exported")
    assert read_hf_config(tmp_path / "exported")[0] == config
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert written["eos_token_id"] == small.get("eos_token_id")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(original)
    # the same transformers model on the same tensors: the same program
    assert_logits_close(expected, torch_logits(reloaded, ids, attention_mask), attention_mask, atol=0)


@pytest.mark.parametrize(("name", "same"), CASES, ids=[name.removesuffix(".json") for name, _ in CASES])
def test_shrunk_real_config_matches_transformers_both_ways(
    name: str, same: list[str], tmp_path: Path
) -> None:
    entry = next(e for e in accepted_entries() if e["file"] == name)
    _check_both_ways(entry["family"], shrink(load(entry), entry["family"]), tmp_path)


# No published file of the corpus turns Qwen2's window on: these do, keeping each file's max_window_layers
# (below the layer count: the window from layer 1 of 2 on; equal to or above it: no layer has the window).
WINDOWED = [
    ("qwen2/Qwen1.5-110B.json", (None, 4)),  # 28 of 80 layers
    ("qwen2/Qwen2.5-0.5B.json", (None, None)),  # 24 of 24
    ("qwen2/Qwen2.5-3B-Instruct.json", (None, None)),  # 70 of 36
]


@pytest.mark.parametrize(("name", "windows"), WINDOWED, ids=[name for name, _ in WINDOWED])
def test_qwen2_window_switched_on_in_a_real_config(name: str, windows: tuple, tmp_path: Path) -> None:
    small = shrink({**load({"file": name}), "use_sliding_window": True}, "qwen2")
    assert config_from_hf_dict(small)[0].layer_windows == windows  # type: ignore[attr-defined]
    _check_both_ways("qwen2", small, tmp_path)


def test_the_distinct_cases_cover_every_accepted_config() -> None:
    covered = sorted(file for _, same in CASES for file in same)
    assert covered == sorted(e["file"] for e in accepted_entries())
    assert len(CASES) < len(covered)


# Files refused only for naming model code in auto_map: the rest of their keys, as transformers reads them
# without trust_remote_code (Phi-4-mini: longrope with legacy 'type', partial rotary, tied, GQA, a window).
WITHOUT_MODEL_CODE = ["phi3/Phi-4-mini-instruct.json"]


@pytest.mark.parametrize("name", WITHOUT_MODEL_CODE)
def test_shrunk_real_config_without_its_model_code_matches_transformers(name: str, tmp_path: Path) -> None:
    family = load({"file": name})["model_type"]
    _check_both_ways(family, shrink(without_model_code(load({"file": name})), family), tmp_path)
