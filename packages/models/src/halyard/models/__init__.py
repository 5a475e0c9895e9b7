"""halyard.models: GPT-2, Llama, Mistral, Qwen2, Mixtral and a muP decoder over named axes.

config = model_config("llama", num_layers=2, hidden_size=64, ...)
model = init_model(config, jax.random.key(0))
logits = model(tokens)                       # tokens: NamedArray (batch, pos)
loss, metrics = model.loss(LmBatch.from_tokens(windows, segment_ids))
"""

import jax as _jax

from halyard.models.batch import LmBatch, segment_positions
from halyard.models.config import ModelConfig, config_class, model_config, register_model, registered_models
from halyard.models.flops import flops_per_token, mean_visible_keys, num_params
from halyard.models.gpt2 import Gpt2, Gpt2Config
from halyard.models.layers.kv_cache import KVCache
from halyard.models.llama import Llama, LlamaConfig, MistralConfig, Qwen2Config
from halyard.models.mixtral import Mixtral, MixtralConfig
from halyard.models.model import CausalLM, DecoderOutput
from halyard.models.mup import MupConfig, MupTransformer, lr_multipliers


def init_model(config: ModelConfig, key: _jax.Array) -> CausalLM:
    """Build the model described by ``config`` with parameters drawn from ``key``.

    Args:
        config: any registered family config (`model_config`).
        key: PRNG key; the same key and config give the same parameters.
    """
    return config.init(key)


__all__ = [
    "CausalLM",
    "DecoderOutput",
    "Gpt2",
    "Gpt2Config",
    "KVCache",
    "Llama",
    "LlamaConfig",
    "LmBatch",
    "MistralConfig",
    "Mixtral",
    "MixtralConfig",
    "ModelConfig",
    "MupConfig",
    "MupTransformer",
    "Qwen2Config",
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
