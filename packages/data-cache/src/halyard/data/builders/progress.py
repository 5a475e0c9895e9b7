"""The build progress bar: shards, documents, tokens and tokens per second, read from the shard ledgers."""

from __future__ import annotations

import time

from tqdm import tqdm

from halyard.data.cache.build_status import BuildStatusReader


class BuildProgress:
    """Polls the ledgers of unfinished shards and shows totals on a tqdm bar (or stays silent)."""

    def __init__(self, root: str, num_shards: int, enabled: bool) -> None:
        self.status = BuildStatusReader(root, num_shards)
        self.started = time.monotonic()
        # Tokens written before this build started (a resumed build) do not count towards its speed.
        self.start_tokens = self.status.read(cache_finished=False).tokens
        self.bar = tqdm(total=num_shards, unit="shard", desc="halyard.data build", disable=not enabled)

    def poll(self) -> None:
        """Re-read the ledgers of unfinished shards and refresh the bar."""
        status = self.status.read(cache_finished=False)
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.n = status.shards_finished
        self.bar.set_postfix(
            documents=status.documents,
            tokens=status.tokens,
            tokens_per_s=int((status.tokens - self.start_tokens) / elapsed),
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        """Show the final state and release the bar."""
        self.poll()
        self.bar.close()
