"""Built-in corpora of different learnability, for DoReMi's demo (``doremi-demo``): English prose (Python's
own documentation), a repetitive domain (the alphabet over and over: learned at once, and teaching nothing
about the other domains) and noise (random binary digits: nothing to learn beyond their alphabet). Every machine can write them; no network."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from pydoc_data.topics import topics  # the text `help()` shows: in every Python installation

import numpy as np

from halyard.train.corpora.python_stdlib import write_python_stdlib_corpus

SHARDS = 4
DOCUMENTS = 400
"""Documents of the generated corpora (repetitive, noise) when ``data.max_documents`` is not set."""
CHARACTERS = 1000
"""Characters per generated document, about a prose document's."""
REPEATED = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def english_prose_documents() -> list[str]:
    """The paragraphs of Python's reference documentation (``pydoc_data.topics``) grouped into documents of
    about `CHARACTERS` characters, in a fixed order (the topics sorted by name)."""
    documents: list[str] = []
    current = ""
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(paragraph.split())
            # Prose: the paragraphs that read as sentences (code samples and tables are left out).
            if len(text) < 80 or not text[0].isupper() or text.count(" ") < len(text) / 9:
                continue
            current = f"{current}\n\n{text}" if current else text
            if len(current) >= CHARACTERS:
                documents.append(current)
                current = ""
    return documents


def repetitive_documents(count: int) -> list[str]:
    """``count`` documents, each `REPEATED` repeated to about `CHARACTERS` characters (not a sentence: a
    repeated English sentence would also teach the prose's spelling)."""
    return [REPEATED * (CHARACTERS // len(REPEATED))] * count


def noise_documents(count: int, *, seed: int = 0) -> list[str]:
    """``count`` documents of `CHARACTERS` binary digits drawn uniformly at random (seeded): once a model
    gives 0 and 1 half the probability each (learned in a few steps) no model does better."""
    alphabet = np.array(list("01"))
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(alphabet, size=CHARACTERS)) for _ in range(count)]


def _writer(documents: Callable[[int], list[str]], prefix: str) -> Callable[[Path, int | None], list[Path]]:
    def write(out_dir: Path, max_documents: int | None) -> list[Path]:
        texts = documents(max_documents or DOCUMENTS)[: max_documents or None]
        return _write_shards(Path(out_dir), prefix, texts)

    return write


def _write_shards(out: Path, prefix: str, texts: list[str]) -> list[Path]:
    """``SHARDS`` jsonl files ``{"text": ...}`` (document i in shard i mod SHARDS); files with these bytes
    already there are kept. Every process of a run may write at once: each writes a file of its own, then
    renames it into place."""
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for index in range(SHARDS):
        content = "".join(json.dumps({"text": text}) + "\n" for text in texts[index::SHARDS])
        shard = out / f"{prefix}-{index:02d}.jsonl"
        if not shard.exists() or shard.read_text(encoding="utf-8") != content:
            temporary = shard.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(content, encoding="utf-8")
            temporary.replace(shard)
        shards.append(shard)
    return shards


BUILTIN_CORPORA: dict[str, Callable[[Path, int | None], list[Path]]] = {
    "python-stdlib": lambda out, most: write_python_stdlib_corpus(out, most),
    "english-prose": _writer(lambda count: english_prose_documents(), "prose"),
    "repetitive": _writer(repetitive_documents, "repetitive"),
    "noise": _writer(noise_documents, "noise"),
}
"""``data.builtin_corpus`` name -> ``(folder, data.max_documents) -> its jsonl shards``, written there."""
