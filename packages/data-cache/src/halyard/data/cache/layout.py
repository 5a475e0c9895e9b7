"""Where each file of a cache lives, and atomic writes through fsspec."""

from __future__ import annotations

import json
import uuid
from typing import Any

import fsspec

# Bumped when the layout or the meaning of a file changes.
CACHE_FORMAT_VERSION = 1
LEDGER_NAME = "ledger.json"
TEMP_MARKER = ".tmp-"


def shard_folder(root: str, shard_index: int) -> str:
    """The folder of one shard's chunks and ledger."""
    return f"{root.rstrip('/')}/shards/{shard_index:05d}"


def shard_ledger_path(root: str, shard_index: int) -> str:
    """The ledger of one shard (progress: rows done, chunks, counters, finished flag)."""
    return f"{shard_folder(root, shard_index)}/{LEDGER_NAME}"


def chunk_paths(root: str, shard_index: int, chunk_index: int) -> tuple[str, str]:
    """The token file and the document-ends file of one chunk."""
    stem = f"{shard_folder(root, shard_index)}/{chunk_index:06d}"
    return stem + ".tokens", stem + ".ends"


def chunk_mask_path(root: str, shard_index: int, chunk_index: int) -> str:
    """The loss-mask file of one chunk (one ``uint8`` per token, 1 on training targets; SFT caches only)."""
    return f"{shard_folder(root, shard_index)}/{chunk_index:06d}.mask"


def cache_ledger_path(root: str) -> str:
    """The cache's top-level ledger (build settings, processor metadata, and when finished, everything)."""
    return f"{root.rstrip('/')}/{LEDGER_NAME}"


def canonical_json(value: Any) -> bytes:
    """The one byte encoding of a ledger: sorted keys, fixed indentation, trailing newline."""
    return (json.dumps(value, sort_keys=True, indent=1) + "\n").encode("utf-8")


def write_atomic(url: str, data: bytes) -> None:
    """Write ``data`` to ``url`` so that readers see the old file or the new one, never a partial one.

    The bytes go to a temporary name in the same folder, then a rename publishes them.
    """
    fs, path = fsspec.core.url_to_fs(url)
    folder, name = path.rsplit("/", 1)
    temporary = f"{folder}/{TEMP_MARKER}{name}-{uuid.uuid4().hex}"
    fs.makedirs(folder, exist_ok=True)
    with fs.open(temporary, "wb") as handle:
        handle.write(data)
    fs.mv(temporary, path)


def read_json(url: str) -> Any | None:
    """The parsed JSON at ``url``, or None when the file does not exist."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def remove_temporaries(root: str, shard_index: int) -> None:
    """Delete the temporary files a killed writer left in a shard folder."""
    fs, folder = fsspec.core.url_to_fs(shard_folder(root, shard_index))
    if not fs.exists(folder):
        return
    for path in fs.ls(folder, detail=False):
        if path.rsplit("/", 1)[-1].startswith(TEMP_MARKER):
            fs.rm(path)
