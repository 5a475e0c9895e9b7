"""halyard.models.lora: low-rank adapters (LoRA) on a decoder's linear layers.

config = LoraConfig(rank=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
lora_model = add_lora(model, config, key=key)       # targeted Linears become LoraLinears (B = 0)
adapters = lora_params(lora_model)                   # {"q_proj": LoraAdapter, ...}, stacked on layers
merged = merge_lora(lora_model)                      # a plain model with W + A B * alpha / rank
"""

from halyard.models.lora.adapter import RANK, LoraAdapter
from halyard.models.lora.attach import (
    Adapters,
    add_lora,
    check_targets,
    init_lora,
    lora_params,
    lora_targets,
    merge_lora,
    module_path,
    with_dropout_keys,
    with_lora,
    without_lora,
)
from halyard.models.lora.config import TARGET_MODULES, LoraConfig
from halyard.models.lora.linear import LoraLinear

__all__ = [
    "RANK",
    "TARGET_MODULES",
    "Adapters",
    "LoraAdapter",
    "LoraConfig",
    "LoraLinear",
    "add_lora",
    "check_targets",
    "init_lora",
    "lora_params",
    "lora_targets",
    "merge_lora",
    "module_path",
    "with_dropout_keys",
    "with_lora",
    "without_lora",
]
