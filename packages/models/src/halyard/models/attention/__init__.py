"""Attention over named axes: one `attention` function, several implementations, one mask description.

``from halyard.models.attention import attention, AttentionMask``.
"""

from halyard.models.attention.dispatch import (
    AUTO_XLA_MAX_SCORES,
    IMPLEMENTATIONS,
    attention,
    choose_implementation,
)
from halyard.models.attention.mask import AttentionMask

__all__ = ["AUTO_XLA_MAX_SCORES", "IMPLEMENTATIONS", "AttentionMask", "attention", "choose_implementation"]
