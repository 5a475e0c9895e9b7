"""Benchmark of halyard.data: build throughput, time to the first batch, loader speed.

Prints three ratios measured in the same run:
- build throughput / raw ``tokenizer.encode_batch`` throughput on the same documents with the same cores
  (goal: at least 0.9); also against ``encode_batch_fast`` (what the builder calls: no offsets);
- seconds from build start to the first readable batch (goal: under 5 s);
- loader tokens/s as a multiple of what one training step of the GPT-2 benchmark model consumes
  (8 x 256 tokens per ~2 s; goal: at least 50x).

Data: ../shared/data/corpora/tinyshakespeare.txt replicated to ~100 MB (``--quick``: ~4 MB) and the 49k BPE
tokenizer from ../shared/data/tokenizers/bpe49k; without them, generated text and a BPE trained here.
Results go to benchmarks/results/data_cache.json.

    python benchmarks/data/data_cache.py [--quick] [--megabytes 100] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from halyard.data import LMDataset, Loader, TokenCache, build_cache
from halyard.data.builders.local import default_num_workers

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results" / "data_cache.json"
# One training step of the GPT-2 benchmark model: batch 8 x 256 tokens, about 2 s per step.
STEP_TOKENS, STEP_SECONDS = 8 * 256, 2.0
LINES_PER_DOCUMENT = 40


def corpus_text() -> tuple[str, str]:
    path = SHARED / "corpora" / "tinyshakespeare.txt"
    if path.exists():
        return path.read_text(encoding="utf-8"), str(path)
    rng = np.random.default_rng(0)
    words = [
        "thou",
        "art",
        "the",
        "king",
        "of",
        "my",
        "heart",
        "and",
        "shall",
        "not",
        "be",
        "gone",
        "to",
        "night",
    ]
    lines = [
        " ".join(rng.choice(words, size=int(rng.integers(3, 12)))).capitalize() + "." for _ in range(40_000)
    ]
    return "\n".join(lines) + "\n", "generated"


def load_tokenizer(text: str) -> tuple[Tokenizer, str]:
    path = SHARED / "tokenizers" / "bpe49k" / "tokenizer.json"
    if path.exists():
        return Tokenizer.from_file(str(path)), str(path)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    return tokenizer, "trained here (8k BPE)"


def make_documents(text: str, megabytes: float) -> list[str]:
    lines = text.splitlines(keepends=True)
    base = ["".join(lines[i : i + LINES_PER_DOCUMENT]) for i in range(0, len(lines), LINES_PER_DOCUMENT)]
    base = [document for document in base if document.strip()]
    documents, size, copy = [], 0, 0
    while size < megabytes * 1e6:
        # A copy number in each document keeps the replicas distinct.
        for document in base:
            documents.append(f"[{copy}] {document}")
            size += len(documents[-1])
        copy += 1
    return documents


def write_shards(documents: list[str], folder: Path, num_shards: int) -> None:
    folder.mkdir(parents=True)
    per_shard = -(-len(documents) // num_shards)
    for index in range(num_shards):
        with open(folder / f"part-{index:03d}.jsonl", "w", encoding="utf-8") as handle:
            for document in documents[index * per_shard : (index + 1) * per_shard]:
                handle.write(json.dumps({"text": document}) + "\n")


def raw_encode_seconds(
    tokenizer: Tokenizer, documents: list[str], fast: bool = False, batch: int = 1024
) -> tuple[float, int]:
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    tokens = 0
    started = time.perf_counter()
    for first in range(0, len(documents), batch):
        encodings = encode(documents[first : first + batch], add_special_tokens=False)
        tokens += sum(len(encoding.ids) for encoding in encodings)
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~4 MB and fewer loader steps (smoke run)")
    parser.add_argument("--megabytes", type=float, default=None, help="corpus size (default 100, quick 4)")
    parser.add_argument(
        "--workers", type=int, default=default_num_workers(), help="build processes (= cores)"
    )
    parser.add_argument("--output", default=str(RESULTS), help="where to write the JSON results")
    args = parser.parse_args()
    megabytes = args.megabytes or (4.0 if args.quick else 100.0)
    loader_steps = 200 if args.quick else 2000

    text, corpus_source = corpus_text()
    tokenizer, tokenizer_source = load_tokenizer(text)
    documents = make_documents(text, megabytes)
    work = Path(tempfile.mkdtemp(prefix="halyard-data-bench-"))
    try:
        tokenizer_path = work / "tokenizer.json"
        tokenizer.save(str(tokenizer_path))
        write_shards(documents, work / "src", num_shards=max(8, 2 * args.workers))
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))  # the baseline uses the same cores
        raw_seconds, raw_tokens = raw_encode_seconds(tokenizer, documents)
        # The builder uses encode_batch_fast (no character offsets); this stricter baseline is reported too.
        fast_seconds, _ = raw_encode_seconds(tokenizer, documents, fast=True)

        started = time.perf_counter()
        handle = build_cache(
            str(work / "src"),
            str(tokenizer_path),
            str(work / "cache"),
            num_workers=args.workers,
            progress=False,
            background=True,
        )
        streaming = LMDataset(TokenCache.open(str(work / "cache")), seq_len=256, shuffle="none")
        streaming.batch(0, 8)
        first_batch_seconds = time.perf_counter() - started
        cache = handle.wait()
        build_seconds = time.perf_counter() - started

        dataset = LMDataset(cache, seq_len=256, seed=0, shuffle="feistel")
        with Loader(dataset, 8, prefetch=8) as loader:
            next(loader)
            loader_started = time.perf_counter()
            for _ in range(loader_steps):
                next(loader)
            loader_seconds = time.perf_counter() - loader_started
        loader_tokens_per_second = loader_steps * 8 * 256 / loader_seconds
        results = {
            "corpus": corpus_source,
            "tokenizer": tokenizer_source,
            "megabytes": round(sum(map(len, documents)) / 1e6, 1),
            "documents": len(documents),
            "tokens": cache.num_tokens,
            "workers": args.workers,
            "raw_encode_batch_tokens_per_second": round(raw_tokens / raw_seconds),
            "build_tokens_per_second": round(cache.num_tokens / build_seconds),
            "build_over_raw_encode_ratio": round((raw_seconds / build_seconds), 3),
            "raw_encode_batch_fast_tokens_per_second": round(raw_tokens / fast_seconds),
            "build_over_raw_encode_batch_fast_ratio": round((fast_seconds / build_seconds), 3),
            "seconds_to_first_batch": round(first_batch_seconds, 2),
            "loader_tokens_per_second": round(loader_tokens_per_second),
            "loader_over_train_step_consumption": round(
                loader_tokens_per_second / (STEP_TOKENS / STEP_SECONDS), 1
            ),
            "quick": args.quick,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"build throughput / raw encode_batch: {results['build_over_raw_encode_ratio']:.3f} (goal >= 0.9)")
    print(
        f"build throughput / raw encode_batch_fast: {results['build_over_raw_encode_batch_fast_ratio']:.3f}"
    )
    print(f"time to first batch: {results['seconds_to_first_batch']:.2f} s (goal < 5 s)")
    print(
        f"loader: {results['loader_over_train_step_consumption']:.0f}x a training step's consumption (goal >= 50x)"
    )
    print(json.dumps(results, indent=1))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
