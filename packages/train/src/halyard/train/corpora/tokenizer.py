"""A byte-level BPE tokenizer trained on a local corpus, for runs without a downloaded tokenizer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"


def _texts(shards: list[Path]) -> Iterator[str]:
    for shard in shards:
        with open(shard, encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)["text"]


def train_bpe_tokenizer(shards: list[Path], out_path: str | Path, vocab_size: int = 4096) -> Path:
    """Train a byte-level BPE tokenizer on the ``text`` of jsonl ``shards``; reuse ``out_path`` if present.

    The tokenizer adds no special tokens by itself; ``<|endoftext|>`` (id 0) is its EOS, which the
    data cache appends to every document.

    Args:
        shards: jsonl files with a ``text`` field.
        out_path: where tokenizer.json goes.
        vocab_size: vocabulary size including the 256 byte tokens and the special token.

    Raises:
        ValueError: ``vocab_size`` is too small to hold the byte alphabet.
    """
    out = Path(out_path)
    if out.exists():
        return out
    if vocab_size < 300:
        raise ValueError(
            f"data.tokenizer_vocab_size={vocab_size} is too small for a byte-level BPE (use >= 300)"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_texts(shards), trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # processes sharing the folder may train it at once
    tokenizer.save(str(tmp))
    tmp.replace(out)
    return out
