"""Llama, and the families that share its layer: Mistral (sliding window) and Qwen2 (q/k/v bias)."""

from halyard.models.families.llama import hf as hf  # registers the family's Hugging Face spec
from halyard.models.families.llama.config import LlamaConfig, MistralConfig, Qwen2Config

__all__ = ["LlamaConfig", "MistralConfig", "Qwen2Config"]
