"""Attention over named axes: one `attention` function, several implementations, one mask description.

``from halyard.models.attention import attention, AttentionMask``.
"""

from halyard.models.attention.dispatch import (
    AUTO_XLA_MAX_SCORES,
    CPU_BLOCK_SIZE,
    IMPLEMENTATIONS,
    attention,
    choose_implementation,
    default_block_size,
)
from halyard.models.attention.mask import AttentionMask
from halyard.models.attention.splash import SplashBlockSizes

__all__ = [
    "AUTO_XLA_MAX_SCORES",
    "CPU_BLOCK_SIZE",
    "IMPLEMENTATIONS",
    "AttentionMask",
    "SplashBlockSizes",
    "attention",
    "choose_implementation",
    "default_block_size",
]
