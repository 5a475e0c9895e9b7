"""Processing: tokenizer loading and identity, the BOS/EOS policy, and batched tokenization."""

from halyard.data.processing.policy import SpecialTokenPolicy, detect_policy
from halyard.data.processing.processor import PROCESSOR_VERSION, Processor
from halyard.data.processing.splitting import safe_split
from halyard.data.processing.tokenizer import TokenizerSpec, load_tokenizer

__all__ = [
    "PROCESSOR_VERSION",
    "Processor",
    "SpecialTokenPolicy",
    "TokenizerSpec",
    "detect_policy",
    "load_tokenizer",
    "safe_split",
]
