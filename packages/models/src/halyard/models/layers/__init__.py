"""Layers shared by the model families: self-attention with an optional KV cache, MLPs, activations."""

from halyard.models.layers.activations import ACTIVATIONS, activation
from halyard.models.layers.kv_cache import KVCache
from halyard.models.layers.mlp import MLP, GatedMLP
from halyard.models.layers.self_attention import SelfAttention

__all__ = ["ACTIVATIONS", "MLP", "GatedMLP", "KVCache", "SelfAttention", "activation"]
