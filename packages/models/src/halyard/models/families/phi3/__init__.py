"""Phi-3: the Llama layer, stored with fused q/k/v and gate/up projections; partial rotary, longrope."""

from halyard.models.families.phi3 import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.phi3.config import Phi3Config

__all__ = ["Phi3Config"]
