"""Gemma, Gemma 2 and Gemma 3 (text): GeGLU, (1 + w) RMSNorms, scaled embeddings; Gemma 2 adds post norms,
soft-capping and alternating sliding-window layers; Gemma 3 adds q/k norms and a local rotary base."""

from halyard.models.families.gemma import hf as hf  # registers the Hugging Face specs
from halyard.models.families.gemma.config import Gemma2Config, Gemma3Config, GemmaConfig

__all__ = ["Gemma2Config", "Gemma3Config", "GemmaConfig"]
