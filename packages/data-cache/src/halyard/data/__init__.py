"""halyard.data: raw text shards -> a parallel, resumable tokenization cache -> deterministic batches.

Documents train on every token; chat and prompt/completion examples (``ExampleFormat``) store a per-token
loss mask next to the tokens, and batches then carry ``loss_mask``; preference records (prompt, chosen,
rejected) become pairs of masked sequences (``PreferenceDataset``).

No JAX needed: batches are numpy arrays, usable from any framework.
"""

from halyard.data.builders import BuildHandle, CacheMismatchError, build_cache
from halyard.data.cache import TokenCache
from halyard.data.datasets import (
    DataManifest,
    FeistelPermutation,
    LMDataset,
    MixtureDataset,
    PreferenceDataset,
    host_rows,
)
from halyard.data.errors import (
    DataInputError,
    SourceFormatError,
    SourceNotFoundError,
    TokenizerLoadError,
    TokenizerNotFoundError,
)
from halyard.data.examples import ExampleError, ExampleFormat
from halyard.data.loader import Loader
from halyard.data.processing import Processor, TokenizerSpec, load_tokenizer
from halyard.data.sources import BadRecordError, MissingFieldError, SourceSpec, UnreadableShardError

__all__ = [
    "BadRecordError",
    "BuildHandle",
    "CacheMismatchError",
    "DataInputError",
    "DataManifest",
    "ExampleError",
    "ExampleFormat",
    "FeistelPermutation",
    "LMDataset",
    "Loader",
    "MissingFieldError",
    "MixtureDataset",
    "PreferenceDataset",
    "Processor",
    "SourceFormatError",
    "SourceNotFoundError",
    "SourceSpec",
    "TokenCache",
    "TokenizerLoadError",
    "TokenizerNotFoundError",
    "TokenizerSpec",
    "UnreadableShardError",
    "build_cache",
    "host_rows",
    "load_tokenizer",
]
