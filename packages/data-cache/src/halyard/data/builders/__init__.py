"""Builders: the local process pool and the Ray builder, both around the same shard worker."""

from halyard.data.builders.build import DEFAULT_CHUNK_TOKENS, BuildHandle, CacheMismatchError, build_cache
from halyard.data.builders.shard_worker import ShardJob, build_shard

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "BuildHandle",
    "CacheMismatchError",
    "ShardJob",
    "build_cache",
    "build_shard",
]
