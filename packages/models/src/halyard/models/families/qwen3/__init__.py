"""Qwen3: the Llama decoder with RMSNorm on each query and key head before rotary."""

from halyard.models.families.qwen3 import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.qwen3.config import Qwen3Config

__all__ = ["Qwen3Config"]
