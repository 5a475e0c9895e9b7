"""Ledgers: per-shard progress written by workers, and the cache ledger written by the build coordinator."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from halyard.data.cache.layout import (
    CACHE_FORMAT_VERSION,
    cache_ledger_path,
    canonical_json,
    read_json,
    shard_ledger_path,
    write_atomic,
)
from halyard.data.sources.records import COUNTER_NAMES


@dataclass(frozen=True)
class ChunkEntry:
    """One committed chunk: ``tokens`` tokens of ``documents`` whole documents, ending at source row ``rows_end``."""

    tokens: int
    documents: int
    rows_end: int

    def to_json(self) -> dict[str, int]:
        """The ledger form."""
        return {"documents": self.documents, "rows_end": self.rows_end, "tokens": self.tokens}


@dataclass
class ShardProgress:
    """The ledger of one shard: rows consumed (always the end of the last committed chunk, or the whole
    shard when finished), its chunks in order, its bad-record counters, and whether it is finished."""

    shard_index: int
    source: dict[str, Any]
    rows_done: int = 0
    finished: bool = False
    chunks: list[ChunkEntry] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0))

    @property
    def tokens(self) -> int:
        """Tokens in the committed chunks."""
        return sum(chunk.tokens for chunk in self.chunks)

    @property
    def documents(self) -> int:
        """Documents in the committed chunks."""
        return sum(chunk.documents for chunk in self.chunks)

    def to_json(self) -> dict[str, Any]:
        """The ledger form."""
        return {
            "shard_index": self.shard_index,
            "source": self.source,
            "rows_done": self.rows_done,
            "finished": self.finished,
            "chunks": [chunk.to_json() for chunk in self.chunks],
            "counters": {name: self.counters.get(name, 0) for name in COUNTER_NAMES},
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ShardProgress:
        """Parse the ledger form."""
        return cls(
            shard_index=value["shard_index"],
            source=value["source"],
            rows_done=value["rows_done"],
            finished=value["finished"],
            chunks=[ChunkEntry(c["tokens"], c["documents"], c["rows_end"]) for c in value["chunks"]],
            counters=dict(value["counters"]),
        )

    def save(self, root: str) -> None:
        """Publish this progress atomically (after the chunk files it lists are in place)."""
        write_atomic(shard_ledger_path(root, self.shard_index), canonical_json(self.to_json()))

    @classmethod
    def load(cls, root: str, shard_index: int) -> ShardProgress | None:
        """The saved progress of a shard, or None before its first commit."""
        value = read_json(shard_ledger_path(root, shard_index))
        return None if value is None else cls.from_json(value)


def build_identity(
    processor_metadata: dict[str, Any],
    chunk_tokens: int,
    first_chunk_tokens: int,
    shards: list[dict[str, str]],
) -> dict[str, Any]:
    """Everything that decides the bytes of a cache; two builds with equal identities write equal bytes."""
    return {
        "format_version": CACHE_FORMAT_VERSION,
        "processor": processor_metadata,
        "chunk_tokens": chunk_tokens,
        "first_chunk_tokens": first_chunk_tokens,
        "shards": shards,
    }


def fingerprint(identity: dict[str, Any]) -> str:
    """A short stable hash of a build identity (the cache's name in dataset manifests).

    Shards known by their content (local files outside the run directory) enter without their path, so a
    moved source keeps the fingerprint, and with it the manifests of checkpoints that read the cache.
    """
    return hashlib.sha256(canonical_json(_without_content_paths(identity))).hexdigest()[:32]


def _without_content_paths(identity: dict[str, Any]) -> dict[str, Any]:
    shards = [
        {key: value for key, value in shard.items() if key != "url"} if "content" in shard else shard
        for shard in identity.get("shards", [])
    ]
    return {**identity, "shards": shards}


def matching_identity(stored: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The identity a build of ``wanted`` keeps when ``stored`` describes the same bytes, else None.

    Equal but for the paths of shards with equal content (the sources moved): ``wanted``, with the new
    paths. A cache written before shards had a ``content`` entry, equal otherwise: ``stored``, unchanged
    (its fingerprint too).
    """
    if _without_content_paths(stored) == _without_content_paths(wanted):
        return wanted
    stored_shards, wanted_shards = stored.get("shards", []), wanted.get("shards", [])
    if len(stored_shards) != len(wanted_shards) or any("content" in shard for shard in stored_shards):
        return None
    legacy = [{key: value for key, value in shard.items() if key != "content"} for shard in wanted_shards]
    return stored if {**wanted, "shards": legacy} == stored else None


def changed_sources(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """One line per source file whose size or leading bytes differ from what the cache was built from."""
    lines = []
    for old, new in zip(stored.get("shards", []), wanted.get("shards", [])):
        if old.get("url") == new.get("url") and "content" in old and old["content"] != new.get("content"):
            before, after = old["content"], new.get("content", {})
            what = (
                f"{before['bytes']} -> {after.get('bytes')} bytes"
                if before["bytes"] != after.get("bytes")
                else "the same size, other leading bytes"
            )
            lines.append(f"the source file {new['url']} changed since the cache was built ({what})")
    return lines


def relocate_cache_ledger(root: str, identity: dict[str, Any]) -> None:
    """Record ``identity`` (the same bytes, its sources at new paths) in the top-level ledger."""
    value = read_json(cache_ledger_path(root))
    assert value is not None, f"{root} holds no cache ledger"
    write_atomic(cache_ledger_path(root), canonical_json({**value, "identity": identity}))


def identity_differences(stored: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable lines ``key: stored -> wanted`` for every leaf that differs."""
    lines = []
    for key in sorted(set(stored) | set(wanted), key=str):
        old, new = stored.get(key, "<absent>"), wanted.get(key, "<absent>")
        name = f"{prefix}{key}"
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(identity_differences(old, new, name + "."))
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            for index, (old_item, new_item) in enumerate(zip(old, new)):
                if old_item != new_item:
                    if isinstance(old_item, dict) and isinstance(new_item, dict):
                        lines.extend(identity_differences(old_item, new_item, f"{name}[{index}]."))
                    else:
                        lines.append(f"{name}[{index}]: {old_item!r} -> {new_item!r}")
        elif old != new:
            shown_old = f"{len(old)} entries" if isinstance(old, list) else repr(old)
            shown_new = f"{len(new)} entries" if isinstance(new, list) else repr(new)
            lines.append(f"{name}: {shown_old} -> {shown_new}")
    return lines


def save_cache_ledger(root: str, identity: dict[str, Any], shards: list[ShardProgress] | None) -> None:
    """Write the top-level ledger: unfinished (identity only) or finished (identity, every shard, totals)."""
    value: dict[str, Any] = {"identity": identity, "finished": shards is not None}
    if shards is not None:
        counters = {name: sum(shard.counters.get(name, 0) for shard in shards) for name in COUNTER_NAMES}
        value["totals"] = {
            "shards": len(shards),
            "chunks": sum(len(shard.chunks) for shard in shards),
            "documents": sum(shard.documents for shard in shards),
            "tokens": sum(shard.tokens for shard in shards),
            "rows": sum(shard.rows_done for shard in shards),
            "counters": counters,
        }
        value["shard_progress"] = [shard.to_json() for shard in shards]
    write_atomic(cache_ledger_path(root), canonical_json(value))


def load_cache_ledger(root: str) -> dict[str, Any] | None:
    """The top-level ledger, or None when the folder holds no cache yet."""
    return read_json(cache_ledger_path(root))
