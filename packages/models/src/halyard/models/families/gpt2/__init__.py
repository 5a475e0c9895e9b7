"""GPT-2: learned absolute positions, LayerNorm, GELU (tanh) MLP, biases everywhere, tied embeddings."""

from halyard.models.families.gpt2 import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.gpt2.config import Gpt2Config

__all__ = ["Gpt2Config"]
