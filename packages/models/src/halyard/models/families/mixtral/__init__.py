"""Mixtral: the Llama layer with its MLP replaced by top-k routed experts."""

from halyard.models.families.mixtral import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.mixtral.config import MixtralConfig

__all__ = ["MixtralConfig"]
