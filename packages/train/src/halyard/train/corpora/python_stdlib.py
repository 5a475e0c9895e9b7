"""The Python standard library's source files as a jsonl corpus: real text that every machine has."""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
from pathlib import Path

BUILTIN_CORPORA = ("python-stdlib",)
"""The names ``data.builtin_corpus`` takes."""
SHARDS = 8


def stdlib_source_files(max_documents: int | None = None) -> list[Path]:
    """The standard library's ``.py`` files outside site-packages, in a fixed (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):  # site-packages pruned, not walked (15x faster)
        subfolders[:] = [name for name in subfolders if name != "site-packages"]
        found += [Path(folder, name) for name in names if name.endswith(".py")]
    files = sorted(path for path in found if path.is_file())
    if not files:
        raise FileNotFoundError(f"no .py files under the standard library folder {root}")
    if max_documents is None or max_documents >= len(files):
        return files
    # Evenly spaced, so a small selection still spans many modules.
    stride = len(files) / max_documents
    return [files[int(i * stride)] for i in range(max_documents)]


def write_python_stdlib_corpus(out_dir: str | Path, max_documents: int | None = None) -> list[Path]:
    """Write the standard library's sources as ``SHARDS`` jsonl shards (``{"text": ..., "path": ...}``).

    Rewriting is skipped when the shards exist and a marker records the same selection, so repeated
    runs reuse the corpus (and its token cache).

    Args:
        out_dir: folder for the shards.
        max_documents: use only this many files, evenly spaced over the sorted list (smoke runs).

    Returns:
        The shard paths, in order.
    """
    out = Path(out_dir)
    files = stdlib_source_files(max_documents)
    marker = out / "corpus.json"
    selection = {"documents": len(files), "first": str(files[0]), "last": str(files[-1])}
    shards = [out / f"stdlib-{i:02d}.jsonl" for i in range(SHARDS)]
    if marker.exists() and json.loads(marker.read_text()) == selection and all(s.exists() for s in shards):
        return shards
    out.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    # Every process of a run (and runs sharing a cache folder) may write at once: each writes files of its
    # own, then renames them into place (the same bytes), the marker last.
    temporary = f".{os.getpid()}.tmp"
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(s.with_suffix(temporary), "w", encoding="utf-8")) for s in shards]
        for i, path in enumerate(files):
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                record = {"text": text, "path": str(path.relative_to(root))}
                handles[i % SHARDS].write(json.dumps(record) + "\n")
    for shard in shards:
        shard.with_suffix(temporary).replace(shard)
    marker.with_suffix(temporary).write_text(json.dumps(selection))
    marker.with_suffix(temporary).replace(marker)
    return shards
