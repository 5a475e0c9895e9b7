"""Helpers shared by the data-cache tests: generated corpora, a trained tokenizer, byte comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

WORDS = ["alpha", "beta", "gamma", "the", "of", "and", "zeta", "über", "naïve", "日本", "x1", "(ok)", "it's"]


def make_documents(count: int, seed: int = 0, max_words: int = 60) -> list[str]:
    """Random documents of known words, some with newlines and punctuation."""
    rng = np.random.default_rng(seed)
    documents = []
    for _ in range(count):
        words = rng.choice(WORDS, size=int(rng.integers(1, max_words)))
        text = " ".join(words)
        if rng.random() < 0.3:
            text = text.replace(" of ", " of\n", 1)
        documents.append(text)
    return documents


def train_tokenizer(
    post_processor: processors.PostProcessor | None = None, vocab_size: int = 320
) -> Tokenizer:
    """A byte-level BPE tokenizer trained on generated text, with <|endoftext|>, <s>, </s> specials."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(make_documents(300, seed=99), trainer)
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    return tokenizer


def write_jsonl(path: Path, documents: list[str], field: str = "text") -> Path:
    """Write one JSON object per document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps({field: document, "id": len(document)}) + "\n")
    return path


def write_jsonl_shards(folder: Path, documents: list[str], num_shards: int) -> list[list[str]]:
    """Split documents round-robin into ``num_shards`` jsonl files; returns each shard's documents."""
    shards = [documents[index::num_shards] for index in range(num_shards)]
    for index, shard in enumerate(shards):
        write_jsonl(folder / f"part-{index:02d}.jsonl", shard)
    return shards


def folder_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (for byte-identity checks)."""
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


def cut_back_to_partial(cache_dir: Path, kept_chunks: int) -> int:
    """Turn a finished cache into what a build killed inside shard 0 leaves: the top ledger unfinished, shard
    0 with only its first ``kept_chunks`` chunks (plus a stray temporary and the next chunk's orphan file),
    later shards absent. Returns the tokens still committed."""
    ledger = json.loads((cache_dir / "ledger.json").read_text())
    (cache_dir / "ledger.json").write_text(json.dumps({"identity": ledger["identity"], "finished": False}))
    shard_ledger = cache_dir / "shards" / "00000" / "ledger.json"
    shard = json.loads(shard_ledger.read_text())
    shard.update(
        chunks=shard["chunks"][:kept_chunks],
        finished=False,
        rows_done=shard["chunks"][kept_chunks - 1]["rows_end"],
        counters=dict.fromkeys(shard["counters"], 0),
    )
    shard_ledger.write_text(json.dumps(shard))
    for path in sorted((cache_dir / "shards" / "00000").glob("*.tokens"))[kept_chunks + 1 :]:
        path.unlink()
    (cache_dir / "shards" / "00000" / f".tmp-{kept_chunks + 1:06d}.tokens-dead").write_bytes(b"junk")
    for folder in sorted((cache_dir / "shards").iterdir())[1:]:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    return sum(chunk["tokens"] for chunk in shard["chunks"])
