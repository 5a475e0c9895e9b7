"""Rotary position embeddings (RoPE) with the scaling variants Hugging Face checkpoints use: the
configuration (config.py), the inverse frequencies of each scaling type (frequencies.py) and the rotation
(apply.py)."""

from halyard.models.rotary.apply import apply_rotary
from halyard.models.rotary.config import SCALINGS, RotaryConfig
from halyard.models.rotary.frequencies import inverse_frequencies

__all__ = ["SCALINGS", "RotaryConfig", "apply_rotary", "inverse_frequencies"]
