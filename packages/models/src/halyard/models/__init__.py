"""halyard.models: decoder families (GPT-2, Llama, Mistral, Qwen2, Mixtral, muP, ...) over named axes, one skeleton.

config = model_config("llama", num_layers=2, hidden_size=64, ...)
model = init_model(config, jax.random.key(0))
logits = model(tokens)                       # tokens: NamedArray (batch, pos)
loss, metrics = model.loss(LmBatch.from_tokens(windows, segment_ids))
# generation: halyard.serve.Engine (a paged KV cache over `CausalLM.paged_step`)
"""

import jax as _jax

from halyard.models.batch import LmBatch, segment_positions
from halyard.models.config import ModelConfig, config_class, model_config, register_model, registered_models
from halyard.models.decoder import BlockLayout, Decoder, DecoderConfig, DecoderShape, LayerKind
from halyard.models.families import (
    Gemma2Config,
    Gemma3Config,
    GemmaConfig,
    Gpt2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    MupConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    lr_multipliers,
)
from halyard.models.flops import flops_per_token, mean_visible_keys, num_params
from halyard.models.layers.paged_kv import PagedKV
from halyard.models.model import CausalLM, DecoderOutput


def init_model(config: ModelConfig, key: _jax.Array) -> CausalLM:
    """Build the model described by ``config`` with parameters drawn from ``key``.

    Args:
        config: any registered family config (`model_config`).
        key: PRNG key; the same key and config give the same parameters.
    """
    return config.init(key)


__all__ = [
    "BlockLayout",
    "CausalLM",
    "Decoder",
    "DecoderConfig",
    "DecoderOutput",
    "DecoderShape",
    "Gemma2Config",
    "Gemma3Config",
    "GemmaConfig",
    "Gpt2Config",
    "LayerKind",
    "LlamaConfig",
    "LmBatch",
    "MistralConfig",
    "MixtralConfig",
    "ModelConfig",
    "MupConfig",
    "Olmo2Config",
    "PagedKV",
    "Phi3Config",
    "Qwen2Config",
    "Qwen3Config",
    "config_class",
    "flops_per_token",
    "init_model",
    "lr_multipliers",
    "mean_visible_keys",
    "model_config",
    "num_params",
    "register_model",
    "registered_models",
    "segment_positions",
]
