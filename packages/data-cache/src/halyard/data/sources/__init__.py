"""Sources: ordered shards of documents read through fsspec (text, jsonl/json, parquet, HF arrow)."""

from halyard.data.sources.records import (
    COUNTER_NAMES,
    EMPTY_DOCUMENT,
    INVALID_UTF8,
    MALFORMED_JSON,
    BadRecordError,
    MissingFieldError,
    Record,
    RecordCounters,
    UnreadableShardError,
)
from halyard.data.sources.rows import Row, read_rows
from halyard.data.sources.shards import (
    FORMATS,
    ShardSpec,
    SourceSpec,
    infer_format,
    read_shard,
    resolve_shards,
)
from halyard.data.sources.urls import expand_braces, expand_urls

__all__ = [
    "COUNTER_NAMES",
    "EMPTY_DOCUMENT",
    "FORMATS",
    "INVALID_UTF8",
    "MALFORMED_JSON",
    "BadRecordError",
    "MissingFieldError",
    "Record",
    "RecordCounters",
    "Row",
    "ShardSpec",
    "SourceSpec",
    "UnreadableShardError",
    "expand_braces",
    "expand_urls",
    "infer_format",
    "read_rows",
    "read_shard",
    "resolve_shards",
]
