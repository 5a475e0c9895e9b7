"""How far a build has got: documents, tokens and shards in every shard ledger, not only the readable prefix."""

from __future__ import annotations

from dataclasses import dataclass

from halyard.data.cache.ledger import ShardProgress


@dataclass(frozen=True)
class BuildStatus:
    """A snapshot of a cache's build, summed over all shard ledgers (shards built out of order count too).

    Attributes:
        documents: documents committed in every shard.
        tokens: tokens committed in every shard.
        shards_finished: shards whose ledger says finished.
        shards: shards in the cache.
        finished: the finished cache ledger is written (no more tokens will appear).
    """

    documents: int
    tokens: int
    shards_finished: int
    shards: int
    finished: bool

    def metrics(self) -> dict[str, float]:
        """The status as ``data/build_*`` metrics for trackers."""
        return {
            "data/build_documents": float(self.documents),
            "data/build_tokens": float(self.tokens),
            "data/build_shards_finished": float(self.shards_finished),
            "data/build_finished": float(self.finished),
        }


class BuildStatusReader:
    """Reads `BuildStatus` of the cache at ``root``, re-reading only the ledgers of unfinished shards."""

    def __init__(self, root: str, num_shards: int) -> None:
        self.root = root
        self.num_shards = num_shards
        self._finished: dict[int, ShardProgress] = {}

    def read(self, cache_finished: bool) -> BuildStatus:
        """The status now (``cache_finished``: whether the finished cache ledger is written)."""
        documents = tokens = 0
        for shard_index in range(self.num_shards):
            progress = self._finished.get(shard_index) or ShardProgress.load(self.root, shard_index)
            if progress is None:
                continue
            if progress.finished:
                self._finished[shard_index] = progress
            documents += progress.documents
            tokens += progress.tokens
        return BuildStatus(documents, tokens, len(self._finished), self.num_shards, cache_finished)
