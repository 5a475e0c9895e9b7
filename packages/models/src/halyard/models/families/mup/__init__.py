"""A muP decoder in the style of Mu-Transformer, and its per-parameter learning-rate multipliers."""

from halyard.models.families.mup.config import MupConfig
from halyard.models.families.mup.multipliers import lr_multipliers

__all__ = ["MupConfig", "lr_multipliers"]
