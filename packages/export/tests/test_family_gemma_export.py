"""Gemma, Gemma 2 and Gemma 3 through halyard.export: transformers checkpoints imported and exported back
(logits and tensors), a Gemma 3 config of transformers' defaults shrunk and checked both ways (no published
one is in the corpus), the config spellings of transformers 4 and 5, and what the architectures cannot hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
from family_round_trip import check_both_ways
from hf_cases import VOCAB
from hf_corpus import shrink

from halyard.export import UnsupportedModelError
from halyard.export.config_reading import config_from_hf_dict
from halyard.export.config_writing import config_to_hf_dict
from halyard.models import Gemma2Config, Gemma3Config, GemmaConfig
from halyard.models.rotary import RotaryConfig

SHAPES: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=64, initializer_range=0.2, bos_token_id=2, eos_token_id=1,
)  # fmt: skip
# Windows (4) shorter than the 12-token batch, caps the logits reach, a scalar other than head_dim.
WINDOWED: dict[str, Any] = dict(sliding_window=4, query_pre_attn_scalar=12)
CASES: dict[str, dict[str, Any]] = {
    "gemma": dict(
        model_type="gemma", architectures=["GemmaForCausalLM"], **SHAPES, num_hidden_layers=2,
        hidden_act="gelu", tie_word_embeddings=False, attention_bias=True,
    ),
    "gemma2": dict(
        model_type="gemma2", architectures=["Gemma2ForCausalLM"], **SHAPES, **WINDOWED, num_hidden_layers=3,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
    ),
    # transformers 4's spelling: rope_theta + rope_scaling (global), rope_local_base_freq, the pattern
    "gemma3": dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], **SHAPES, **WINDOWED, num_hidden_layers=4,
        sliding_window_pattern=3, rope_theta=1000000.0, rope_local_base_freq=100.0,
        rope_scaling=dict(rope_type="linear", factor=2.0),
    ),
}  # fmt: skip

# No published Gemma 3 text config.json is in the corpus (fixtures/hf-configs): this one is transformers
# 5.24's Gemma3TextConfig() defaults as its to_dict() gives them (without PretrainedConfig's generic keys),
# with the architecture Gemma3ForCausalLM saves: transformers 5's spelling (rope_parameters per layer type).
GEMMA3_DEFAULTS_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262208,
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "initializer_range": 0.02, "rms_norm_eps": 1e-06, "use_cache": True,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
    "_sliding_window_pattern": 6, "transformers_version": "5.24.0",
}  # fmt: skip


def test_gemma_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    config = check_both_ways(CASES["gemma"], tmp_path)
    assert isinstance(config, GemmaConfig) and not isinstance(config, Gemma2Config)
    # the legacy hidden_act "gelu" is the tanh approximation to transformers
    assert (config.activation, config.tie_embeddings, config.attention_bias) == (
        "gelu_pytorch_tanh",
        False,
        True,
    )


def test_gemma2_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    config = check_both_ways(CASES["gemma2"], tmp_path)
    assert isinstance(config, Gemma2Config) and config.layer_windows == (4, None, 4)
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (5.0, 3.0)


def test_gemma3_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    config = check_both_ways(CASES["gemma3"], tmp_path)
    assert isinstance(config, Gemma3Config) and config.layer_windows == (4, 4, None, 4)
    assert config.rope == RotaryConfig(theta=1000000.0, scaling="linear", factor=2.0)
    assert config.local_rope == RotaryConfig(theta=100.0)


def test_gemma3_defaults_config_shrunk_matches_transformers_both_ways(tmp_path: Path) -> None:
    full = config_from_hf_dict(GEMMA3_DEFAULTS_CONFIG, strict=True)[0]
    assert full == Gemma3Config(eos_token_ids=(1,))  # Halyard's defaults are transformers'
    small = shrink(GEMMA3_DEFAULTS_CONFIG, "gemma3_text")
    # six layers, so that both a local and the global layer (and their rotary bases) are there
    small.update(num_hidden_layers=6, layer_types=GEMMA3_DEFAULTS_CONFIG["layer_types"][:6])
    config = check_both_ways(small, tmp_path)
    assert config.layer_windows == (4,) * 5 + (None,)


def test_the_spellings_of_transformers_4_and_5_read_alike() -> None:
    old = config_from_hf_dict(CASES["gemma3"])[0]
    new = transformers.Gemma3TextConfig.from_dict(CASES["gemma3"]).to_dict()
    assert "rope_local_base_freq" not in new and isinstance(new["rope_parameters"]["full_attention"], dict)
    assert config_from_hf_dict(new)[0] == old
    gemma2 = {key: value for key, value in CASES["gemma2"].items()}
    assert config_from_hf_dict({**gemma2, "layer_types": None})[0] == config_from_hf_dict(gemma2)[0]
    real = json.loads((Path(__file__).parent / "fixtures/hf-configs/gemma2/gemma-2-2b.json").read_text())
    assert config_from_hf_dict(real, strict=True)[0] == Gemma2Config(eos_token_ids=(1,))


@pytest.mark.parametrize(
    ("case", "change", "message"),
    [
        (
            "gemma3",
            dict(layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"]),
            "sliding_window_pattern n",
        ),
        ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        ("gemma", dict(sliding_window=4), "sliding_window=4"),
        ("gemma3", dict(rope_parameters={"rope_type": "default"}), "one dict per layer type"),
    ],
)
def test_configs_halyard_cannot_compute_are_refused(case: str, change: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        config_from_hf_dict({**CASES[case], **change})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (GemmaConfig(activation="gelu"), "activation='gelu'.*gelu_pytorch_tanh"),
        (Gemma3Config(local_rope=RotaryConfig(scaling="linear", factor=2.0)), "local_rope.scaling='linear'"),
        (Gemma2Config(rope=RotaryConfig(partial_rotary_factor=0.5)), "partial_rotary_factor=0.5"),
    ],
)
def test_options_the_architectures_cannot_hold_are_refused(config: Any, message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        config_to_hf_dict(config, vocab_size=config.vocab_size, dtype="float32")
