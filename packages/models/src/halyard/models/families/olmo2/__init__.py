"""OLMo 2: the Llama decoder with its norms after attention and after the MLP, and q/k RMSNorm."""

from halyard.models.families.olmo2 import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.olmo2.config import Olmo2Config

__all__ = ["Olmo2Config"]
