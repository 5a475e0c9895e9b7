"""Preference pairs over a token cache: each example a chosen and a rejected sequence with their loss masks."""

from __future__ import annotations

from typing import Any

import numpy as np

from halyard.data.cache.reader import TokenCache
from halyard.data.datasets.manifest import DataManifest
from halyard.data.datasets.windows import LMDataset


class PreferenceDataset(LMDataset):
    """The pairs of a cache built with ``ExampleFormat(kind="preference")``: pair ``p`` is the cache's
    documents ``2p`` (prompt + chosen reply) and ``2p + 1`` (prompt + rejected reply).

    An example is the pair, not a window: each sequence starts at its own BOS and is cut to ``seq_len + 1``
    tokens (the end of a longer one is dropped, as TRL's ``max_length`` with ``keep_start``), then padded
    with the EOS id; padding has loss mask 0, and under causal attention no real token sees it. The order of
    the pairs (``shuffle``, epochs, the train/validation split) follows the rules of `LMDataset` with pairs
    in place of windows, so a batch is a pure function of (cache, settings, seed, step).
    """

    def __init__(self, cache: TokenCache, seq_len: int, **settings: Any) -> None:
        """Args:
        cache: a preference cache (finished or still being built).
        seq_len: each sequence has ``seq_len + 1`` tokens (inputs and shifted targets), as `LMDataset`'s.
        settings: ``seed``, ``shuffle``, ``era_windows``, ``split``, ``validation_fraction``: as
            `LMDataset`'s, counted in pairs.

        Raises:
            ValueError: the cache holds other examples than preference pairs, or a bad setting.
        """
        kinds = {shard.get("example", {}).get("kind", "text") for shard in cache.identity["shards"]}
        if kinds != {"preference"}:
            raise ValueError(
                f"the cache at {cache.root} holds {', '.join(sorted(kinds))} examples, not only preference pairs; "
                "build it from preference records (example_format='preference', or data.format: preference)"
            )
        super().__init__(cache, seq_len, **settings)
        self.pad_id = int(cache.processor_metadata["eos_id"])

    @property
    def manifest(self) -> DataManifest:
        """The identity of this pair stream (cache fingerprint, seed and every setting)."""
        settings = super().manifest.to_dict()["settings"]
        return DataManifest.create("preference", settings)

    def available_examples(self) -> int:
        """Pairs of the split whose tokens are committed now (all of them once the cache is finished)."""
        self.cache.refresh()
        return self.split.count(self.cache.num_documents // 2)

    def __len__(self) -> int:
        """Pairs per epoch; waits for the finished cache.

        Raises:
            ValueError: the finished cache holds no pair in this split.
        """
        if not self.cache.is_finished:
            self.cache.wait_until_finished()
        count = self.available_examples()
        if count == 0:
            raise ValueError(
                f"the cache at {self.cache.root} holds {self.cache.num_documents // 2} preference pairs, none "
                f"in split {self.split.split!r}; add data or lower the validation fraction"
            )
        return count

    def _wait_for_examples(self, count: int) -> None:
        pairs = int(self.split.windows(np.array([count - 1]))[0]) + 1
        self.cache.wait_until(lambda: self.cache.num_documents >= 2 * pairs, f"{pairs} preference pairs")

    def examples(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Pairs ``indices`` of the stream: ``chosen_tokens``, ``chosen_loss_mask``, ``rejected_tokens`` and
        ``rejected_loss_mask``, each int32 ``[len(indices), seq_len + 1]`` (the mask 1 on reply tokens)."""
        pairs = self.windows(indices)
        width = self.seq_len + 1
        out = {
            f"{side}_{name}": np.full((len(pairs), width), fill, np.int32)
            for side in ("chosen", "rejected")
            for name, fill in (("tokens", self.pad_id), ("loss_mask", 0))
        }
        for row, pair in enumerate(pairs):
            for offset, side in enumerate(("chosen", "rejected")):
                start, stop = self.cache.document_span(2 * int(pair) + offset)
                stop = min(stop, start + width)
                out[f"{side}_tokens"][row, : stop - start] = self.cache.read(start, stop)
                out[f"{side}_loss_mask"][row, : stop - start] = self.cache.read_loss_mask(start, stop)
        return out
