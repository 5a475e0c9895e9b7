"""Layers the decoder block is built from: self-attention with an optional KV cache, MLPs, routed experts.

Activations are `halyard.named.nn.ACTIVATIONS` (one registry for every package).
"""

from halyard.models.layers.mlp import MLP, GatedMLP
from halyard.models.layers.moe import MoeMLP
from halyard.models.layers.paged_kv import PagedKV
from halyard.models.layers.self_attention import SelfAttention

__all__ = ["MLP", "GatedMLP", "MoeMLP", "PagedKV", "SelfAttention"]
