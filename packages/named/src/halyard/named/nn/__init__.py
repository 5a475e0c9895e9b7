"""halyard.named.nn: layers over named axes (equinox modules built by ``Layer.init(Axes..., key=...)``)."""

from halyard.named.nn.embedding import Embedding
from halyard.named.nn.linear import DotGeneral, Linear
from halyard.named.nn.normalization import LayerNorm, RMSNorm

__all__ = [
    "DotGeneral",
    "Embedding",
    "LayerNorm",
    "Linear",
    "RMSNorm",
]
