"""Corpora present on every machine, for the demo and smoke runs (no network)."""

from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import END_OF_TEXT, train_bpe_tokenizer

BUILTIN_CORPORA = ("python-stdlib",)

__all__ = ["BUILTIN_CORPORA", "END_OF_TEXT", "train_bpe_tokenizer", "write_python_stdlib_corpus"]
