"""The run's tokenizer: where it is, and the one way to load it."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from halyard.data import load_tokenizer
from halyard.train.corpora.bytes_tokenizer import tokenizer_file
from halyard.train.data_assembly.data_section import hf_tokenizer_folder, work_dir_of
from halyard.train.run_config import DataConfig


def tokenizer_path_of(config: DataConfig, run_dir: Path, *, init: str = "auto") -> str:
    """Where the run's tokenizer is: ``data.tokenizer`` (a tokenizer.json or a folder), else the folder of
    ``trainer.init: hf:FOLDER`` when it holds one, else the one trained for a ``builtin_corpus``."""
    trained = work_dir_of(config, run_dir) / "corpus" / "tokenizer.json"
    named = tokenizer_file(config.tokenizer) if config.tokenizer else None
    return named or hf_tokenizer_folder(init) or str(trained)


def load_run_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at ``path`` (a tokenizer.json or a tokenizer folder), read as the token cache reads it:
    the one loader of the cache, the evaluator, sampling and ``halyard generate``.

    Raises:
        TokenizerNotFoundError, TokenizerLoadError: nothing there, or not a tokenizer (the path is named).
    """
    return load_tokenizer(path).build()
