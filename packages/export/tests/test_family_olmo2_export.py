"""OLMo 2 through halyard.export: a transformers checkpoint (post norms, projection-wide q/k norms, an
explicit head_dim, biases) imported and exported back, and what Olmo2ForCausalLM cannot hold refused both
ways."""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import pytest
from family_round_trip import check_both_ways
from hf_cases import VOCAB

from halyard.export import UnsupportedModelError, export_hf, read_hf_config
from halyard.models import Olmo2Config

HF_CONFIG = dict(
    model_type="olmo2", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
    initializer_range=0.2, attention_bias=True, rope_theta=500000.0, eos_token_id=2, pad_token_id=1,
)  # fmt: skip


def test_checkpoint_imports_and_exports_back(tmp_path: Path) -> None:
    config = check_both_ways(HF_CONFIG, tmp_path)
    assert isinstance(config, Olmo2Config)
    assert (config.head_dim, config.num_kv_heads, config.attention_bias) == (16, 2, True)
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["head_dim"] == 16


def test_a_config_json_with_a_window_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**HF_CONFIG, "sliding_window": 4}))
    with pytest.raises(UnsupportedModelError, match="sliding_window=4 is not an option of Olmo2ForCausalLM"):
        read_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(sliding_window=4), "sliding_window=4, which Hugging Face's Olmo2ForCausalLM cannot express"),
        (dict(mlp_bias=True), "mlp_bias=True, which Hugging Face's Olmo2ForCausalLM cannot express"),
        (dict(attention_bias=True, qkv_bias_only=True), "q/k/v biases without an output bias"),
    ],
)
def test_options_olmo2_cannot_hold_are_refused(options: dict, message: str, tmp_path: Path) -> None:
    config = Olmo2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4, num_kv_heads=4,
        max_position=64, **options,
    )  # fmt: skip
    abstract = eqx.filter_eval_shape(config.init, jax.random.key(0))  # refused before any array is read
    with pytest.raises(UnsupportedModelError, match=message):
        export_hf(abstract, tmp_path / "exported")
