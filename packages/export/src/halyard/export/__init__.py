"""halyard.export: Hugging Face <-> Halyard model folders (config.json, safetensors, tokenizer files).

config, model = import_hf("path/to/hf-folder")                       # unsharded
config, model = import_hf(folder, layout=Layout.fsdp(), mesh=mesh)   # each device reads its slice
export_hf(model, "out/", tokenizer="tokenizer.json", dtype="bfloat16", max_shard_bytes=2**30)
export_peft_adapter(lora_model, "adapter/", base_model="out/")     # a LoRA model's adapters for PEFT
"""

from halyard.export.config_reading import HfModelInfo
from halyard.export.errors import (
    HfConversionError,
    MissingHfFileError,
    MissingWeightError,
    PickleRefusedError,
    ShapeMismatchError,
    UnexpectedWeightError,
    UnsupportedModelError,
)
from halyard.export.exporter import DEFAULT_MAX_SHARD_BYTES, EXPORT_DTYPES, export_hf
from halyard.export.importer import import_hf, read_hf_config
from halyard.export.peft_adapter import export_peft_adapter
from halyard.export.tokenizer_files import TokenizerInfo, read_tokenizer

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "EXPORT_DTYPES",
    "HfConversionError",
    "HfModelInfo",
    "MissingHfFileError",
    "MissingWeightError",
    "PickleRefusedError",
    "ShapeMismatchError",
    "TokenizerInfo",
    "UnexpectedWeightError",
    "UnsupportedModelError",
    "export_hf",
    "export_peft_adapter",
    "import_hf",
    "read_hf_config",
    "read_tokenizer",
]
