"""One folder per model family: its config (sizes, `BlockLayout`, per-layer kinds) and its Hugging Face
mapping. Importing this package registers every family (`halyard.models.registered_models`)."""

from halyard.models.families.gemma import Gemma2Config, Gemma3Config, GemmaConfig
from halyard.models.families.gpt2 import Gpt2Config
from halyard.models.families.llama import LlamaConfig, MistralConfig, Qwen2Config
from halyard.models.families.mixtral import MixtralConfig
from halyard.models.families.mup import MupConfig, lr_multipliers
from halyard.models.families.olmo2 import Olmo2Config
from halyard.models.families.phi3 import Phi3Config
from halyard.models.families.qwen3 import Qwen3Config

__all__ = [
    "Gemma2Config",
    "Gemma3Config",
    "GemmaConfig",
    "Gpt2Config",
    "LlamaConfig",
    "MistralConfig",
    "MixtralConfig",
    "MupConfig",
    "Olmo2Config",
    "Phi3Config",
    "Qwen2Config",
    "Qwen3Config",
    "lr_multipliers",
]
