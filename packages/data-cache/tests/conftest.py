"""Shared fixtures: a real byte-level BPE tokenizer trained here (no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

# Helper modules (data_helpers.py) sit next to the tests; pytest's importlib mode does not add this folder
# to sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))

from data_helpers import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return train_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> str:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)
