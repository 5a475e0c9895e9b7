"""The registry of families and config validation."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import pytest

from halyard.models import (
    Gpt2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    MupConfig,
    Qwen2Config,
    config_class,
    init_model,
    model_config,
    register_model,
    registered_models,
)


def test_every_family_is_registered_with_its_defaults() -> None:
    original = {"gpt2", "llama", "mistral", "mixtral", "mup", "qwen2"}
    today = {"gemma", "gemma2", "gemma3", "olmo2", "phi3", "qwen3"}
    assert list(registered_models()) == sorted(original | today)
    expected = {"gpt2": Gpt2Config, "llama": LlamaConfig, "mistral": MistralConfig, "mixtral": MixtralConfig,
                "mup": MupConfig, "qwen2": Qwen2Config}  # fmt: skip
    for name, cls in expected.items():
        assert config_class(name) is cls and cls.family == name
    assert model_config("mistral").sliding_window == 4096
    assert model_config("qwen2").attention_bias and model_config("qwen2").qkv_bias_only
    assert model_config("llama", num_layers=3).num_layers == 3


def test_configs_are_frozen_and_replace_checks_names() -> None:
    config = model_config("llama", hidden_size=64, num_heads=4, num_kv_heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 3  # type: ignore[misc]
    assert config.replace(num_layers=5).num_layers == 5
    with pytest.raises(TypeError, match="did you mean 'num_layers'"):
        config.replace(num_layer=5)
    assert hash(config) == hash(model_config("llama", hidden_size=64, num_heads=4, num_kv_heads=2))


def test_unknown_names_and_bad_values_get_clear_errors() -> None:
    with pytest.raises(KeyError, match="Did you mean 'llama'"):
        model_config("lama")
    with pytest.raises(TypeError, match="did you mean 'num_kv_heads'"):
        model_config("llama", num_kv_head=2)
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        model_config("llama", num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="remat='sometimes'"):
        model_config("gpt2", remat="sometimes")
    with pytest.raises(ValueError, match="attention_implementation='flash'"):
        model_config("gpt2", attention_implementation="flash")
    with pytest.raises(ValueError, match="activation"):
        model_config("llama", activation="swoosh")
    with pytest.raises(ValueError, match="head_dim"):
        model_config("mup", hidden_size=100, head_dim=16)
    with pytest.raises(ValueError, match="num_experts_per_token"):
        model_config("mixtral", num_experts=2, num_experts_per_token=3)
    with pytest.raises(ValueError, match="set head_dim explicitly"):
        model_config("llama", hidden_size=30, num_heads=4, num_kv_heads=4)
    with pytest.raises(ValueError, match="loss_full_logits_max_mib must be a non-negative int, got -1"):
        model_config("gpt2", loss_full_logits_max_mib=-1)
    with pytest.raises(ValueError, match="attention_block_size must be positive, got 0"):
        model_config("gpt2", attention_block_size=0)
    with pytest.raises(ValueError, match="attention_block_size must be an int or None"):
        model_config("llama", attention_block_size=64.0)
    assert model_config("gpt2").attention_block_size is None  # the backend's default block


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2", "mixtral", "mup"])
def test_attention_block_size_reaches_every_family_s_attention(family: str) -> None:
    heads = {"gpt2": {"num_heads": 4}, "mup": {"head_dim": 8}}.get(
        family, {"num_heads": 4, "num_kv_heads": 2}
    )
    config = model_config(family, hidden_size=32, num_layers=1, attention_block_size=16, **heads)
    model = eqx.filter_eval_shape(config.init, jax.random.PRNGKey(0))  # a static field: shapes suffice
    blocks = [
        leaf.block_size
        for leaf in jax.tree.leaves(model, is_leaf=lambda x: hasattr(x, "block_size"))
        if hasattr(leaf, "block_size")
    ]
    assert blocks == [16]


def test_register_model_refuses_a_second_class_for_a_name() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @register_model("llama")
        @dataclasses.dataclass(frozen=True)
        class Other(LlamaConfig):
            pass


def test_head_dim_is_independent_of_width() -> None:
    config = model_config("llama", vocab_size=11, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=4,
                          num_kv_heads=1, head_dim=8)  # fmt: skip
    model = eqx.filter_eval_shape(init_model, config, jax.random.key(0))
    attention = model.layers.stacked.attention
    assert attention.q_proj.weight.shape == {"layers": 1, "embed": 16, "heads": 4, "head_size": 8}
    assert attention.k_proj.weight.shape == {"layers": 1, "embed": 16, "kv_heads": 1, "head_size": 8}


def test_gpt2_refuses_sequences_longer_than_its_positions() -> None:
    from tiny import random_tokens, tiny

    # refused while tracing: shapes suffice, no initialisation or forward pass is compiled
    model = eqx.filter_eval_shape(init_model, tiny("gpt2", max_position=8), jax.random.key(0))
    with pytest.raises(ValueError, match="8 learned positions but got a sequence of 9"):
        eqx.filter_eval_shape(model, random_tokens(1, 9))
