"""What each family knows about its Hugging Face checkpoints: key rules, tensor mappings, config
readers and writers (`HfFamily`), used by `halyard.export` and by the models' own parity tests.
Nothing here imports torch or transformers."""

from halyard.models.hf.errors import HfConversionError, UnsupportedModelError
from halyard.models.hf.key_rule import COMMON_RULE, KeyRule, names
from halyard.models.hf.spec import HfFamily, hf_families, hf_family, register_hf
from halyard.models.hf.tensor_mapping import TensorMapping

__all__ = [
    "COMMON_RULE",
    "HfConversionError",
    "HfFamily",
    "KeyRule",
    "TensorMapping",
    "UnsupportedModelError",
    "hf_families",
    "hf_family",
    "names",
    "register_hf",
]
