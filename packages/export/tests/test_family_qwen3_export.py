"""Qwen3 through halyard.export: a transformers checkpoint imported and exported back (logits and tensors),
a model made in Halyard exported for transformers, and the options Qwen3ForCausalLM cannot hold refused."""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import pytest
import transformers
from family_round_trip import check_both_ways
from hf_cases import VOCAB, assert_logits_close, halyard_logits, padded_batch, referee_tolerance, torch_logits

from halyard.export import UnsupportedModelError, export_hf
from halyard.models import Qwen3Config, init_model

# q/k/v/o biases, 16-channel heads on a 32-wide model, and windows (3 < the 12-token batch) from layer 1 on
HF_CONFIG = dict(
    model_type="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
    initializer_range=0.2, attention_bias=True, use_sliding_window=True, sliding_window=3,
    max_window_layers=1, rope_theta=1000000.0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def test_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    config = check_both_ways(HF_CONFIG, tmp_path)
    assert isinstance(config, Qwen3Config)
    assert (config.layer_windows, config.head_dim, config.attention_bias) == ((None, 3, 3), 16, True)


def test_a_model_made_in_halyard_exports_for_transformers(tmp_path: Path) -> None:
    # head_dim None means hidden_size // num_heads (8) to Halyard but 128 to transformers' Qwen3Config
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=None, max_position=64, tie_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    model = init_model(config, jax.random.key(0))
    export_hf(model, tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["head_dim"] == 8
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="eager"
    ).eval()
    ids, attention_mask = padded_batch()
    expected = halyard_logits(model, ids, attention_mask)
    assert_logits_close(
        expected,
        torch_logits(reloaded, ids, attention_mask),
        attention_mask,
        atol=referee_tolerance(config, expected),
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(mlp_bias=True), "mlp_bias=True, which Hugging Face's Qwen3ForCausalLM cannot express"),
        (dict(attention_bias=True, qkv_bias_only=True), "q/k/v biases without an output bias.*qwen2"),
    ],
)
def test_options_qwen3_cannot_hold_are_refused(options: dict, message: str, tmp_path: Path) -> None:
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4, num_kv_heads=2,
        head_dim=8, max_position=64, **options,
    )  # fmt: skip
    abstract = eqx.filter_eval_shape(config.init, jax.random.key(0))  # refused before any array is read
    with pytest.raises(UnsupportedModelError, match=message):
        export_hf(abstract, tmp_path / "exported")
