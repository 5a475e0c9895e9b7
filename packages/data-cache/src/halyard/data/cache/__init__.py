"""The cache format: chunked token arrays with document ends, per-shard ledgers, and the reader."""

from halyard.data.cache.layout import CACHE_FORMAT_VERSION
from halyard.data.cache.ledger import ChunkEntry, ShardProgress, fingerprint, identity_differences
from halyard.data.cache.reader import TokenCache

__all__ = [
    "CACHE_FORMAT_VERSION",
    "ChunkEntry",
    "ShardProgress",
    "TokenCache",
    "fingerprint",
    "identity_differences",
]
