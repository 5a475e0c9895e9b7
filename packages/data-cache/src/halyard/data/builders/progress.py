"""The build progress bar: shards, documents, tokens and tokens per second, read from the shard ledgers."""

from __future__ import annotations

import time

from tqdm import tqdm

from halyard.data.cache.ledger import ShardProgress


class BuildProgress:
    """Polls the ledgers of unfinished shards and shows totals on a tqdm bar (or stays silent)."""

    def __init__(self, root: str, num_shards: int, enabled: bool) -> None:
        self.root = root
        self.num_shards = num_shards
        self.finished: dict[int, ShardProgress] = {}
        self.started = time.monotonic()
        # Tokens written before this build started (a resumed build) do not count towards its speed.
        self.start_tokens = self._totals()[1]
        self.bar = tqdm(total=num_shards, unit="shard", desc="halyard.data build", disable=not enabled)

    def _totals(self) -> tuple[int, int]:
        """(documents, tokens) in the shard ledgers now; remembers the finished shards."""
        documents = tokens = 0
        for shard_index in range(self.num_shards):
            progress = self.finished.get(shard_index) or ShardProgress.load(self.root, shard_index)
            if progress is None:
                continue
            if progress.finished:
                self.finished[shard_index] = progress
            documents += progress.documents
            tokens += progress.tokens
        return documents, tokens

    def poll(self) -> None:
        """Re-read the ledgers of unfinished shards and refresh the bar."""
        documents, tokens = self._totals()
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.n = len(self.finished)
        self.bar.set_postfix(
            documents=documents,
            tokens=tokens,
            tokens_per_s=int((tokens - self.start_tokens) / elapsed),
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        """Show the final state and release the bar."""
        self.poll()
        self.bar.close()
