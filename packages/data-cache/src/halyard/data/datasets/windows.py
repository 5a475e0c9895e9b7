"""Language-model windows over a token cache: fixed-length, shuffled, split, and batched by step."""

from __future__ import annotations

import numpy as np

from halyard.data.cache.reader import TokenCache
from halyard.data.datasets.manifest import DataManifest
from halyard.data.datasets.permutation import FeistelPermutation
from halyard.data.datasets.split import WindowSplit
from halyard.data.errors import NotEnoughTokensError

SHUFFLES = ("none", "feistel", "era")


def host_rows(step: int, batch_size: int, host_index: int, host_count: int) -> np.ndarray:
    """The global example indices of host ``host_index``'s share of the batch of ``step``.

    The global batch of step ``s`` is examples ``[s * batch_size, (s + 1) * batch_size)``; host ``h`` of
    ``H`` takes the ``h``-th of ``H`` equal consecutive slices, so the concatenation over hosts is the
    same global batch for every host count.

    Raises:
        ValueError: ``batch_size`` not divisible by ``host_count``, or a host index out of range.
    """
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ValueError(
            f"host_index must be in [0, host_count), got host_index={host_index}, host_count={host_count}"
        )
    if batch_size % host_count:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by host_count={host_count}; every host must get the "
            "same number of rows: choose a batch size that is a multiple of the number of hosts"
        )
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    per_host = batch_size // host_count
    first = step * batch_size + host_index * per_host
    return np.arange(first, first + per_host, dtype=np.int64)


class LMDataset:
    """Windows of ``seq_len + 1`` tokens over the cache's concatenated token stream.

    Window ``w`` holds tokens ``[w * seq_len, w * seq_len + seq_len + 1)``: consecutive windows share one
    token, so inputs ``tokens[:-1]`` and targets ``tokens[1:]`` cover every token once. ``segment_ids``
    number the documents inside each window from 0 (a document's EOS belongs to it), so attention can stay
    inside a document.

    Order: example ``i`` of the split maps to a window by ``shuffle``: ``"none"`` (stream order, starts
    at once), ``"era"`` (a keyed permutation inside each era of ``era_windows`` examples; starts when
    the first era is written) or ``"feistel"`` (a keyed permutation of the whole split; waits for the
    finished cache). After the last example the order restarts with a new permutation per epoch. Every
    example is a pure function of (cache fingerprint, settings, seed, index).
    """

    def __init__(
        self,
        cache: TokenCache,
        seq_len: int,
        *,
        seed: int = 0,
        shuffle: str = "feistel",
        era_windows: int = 4096,
        split: str = "all",
        validation_fraction: float = 0.0,
    ) -> None:
        """Args:
        cache: the token cache (finished or still being built).
        seq_len: tokens per training sequence; each example has ``seq_len + 1`` tokens.
        seed: chooses the shuffle and the held-out windows.
        shuffle: ``"feistel"``, ``"era"`` or ``"none"`` (see the class docstring).
        era_windows: examples per era for ``shuffle="era"``.
        split: ``"all"``, ``"train"`` or ``"validation"``.
        validation_fraction: the share of windows held out for validation (with ``split`` train/validation).

        Raises:
            ValueError: a bad ``seq_len``, ``shuffle``, ``era_windows``, ``split`` or fraction.
        """
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle {shuffle!r} is not known; use one of {SHUFFLES}")
        if era_windows < 1:
            raise ValueError(f"era_windows must be positive, got {era_windows}")
        self.cache = cache
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self.era_windows = era_windows
        self.split = WindowSplit.create(split, validation_fraction, seed)
        self.validation_fraction = validation_fraction if split != "all" else 0.0

    @property
    def manifest(self) -> DataManifest:
        """The identity of this example stream (cache fingerprint, seed and every setting)."""
        return DataManifest.create(
            "lm",
            {
                "cache": self.cache.fingerprint,
                "seq_len": self.seq_len,
                "seed": self.seed,
                "shuffle": self.shuffle,
                "era_windows": self.era_windows if self.shuffle == "era" else None,
                "split": self.split.split,
                "validation_fraction": self.validation_fraction,
            },
        )

    def available_examples(self) -> int:
        """Examples of the split whose tokens are committed now (all of them once the cache is finished)."""
        self.cache.refresh()
        windows = max(0, (self.cache.num_tokens - 1) // self.seq_len)
        return self.split.count(windows)

    def __len__(self) -> int:
        """Examples per epoch; waits for the finished cache.

        Raises:
            NotEnoughTokensError: the finished cache holds no complete window (a `ValueError` too).
        """
        if not self.cache.is_finished:
            self.cache.wait_until_finished()
        count = self.available_examples()
        if count == 0:
            raise NotEnoughTokensError(
                f"the cache at {self.cache.root} holds {self.cache.num_tokens} tokens: not one window of "
                f"seq_len + 1 = {self.seq_len + 1} tokens in split {self.split.split!r}; add data or lower seq_len"
            )
        return count

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """Window numbers of examples ``indices`` after the shuffle and the split (waits as needed)."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            return indices
        if self.shuffle == "feistel" or self.cache.is_finished:
            return self.split.windows(self._finished_order(indices))
        if self.shuffle == "none":
            needed = int(indices.max()) + 1
            self._wait_for_examples(needed)
            if self.cache.is_finished:
                return self.windows(indices)
            return self.split.windows(indices)
        eras = indices // self.era_windows
        self._wait_for_examples(int((eras.max() + 1) * self.era_windows))
        if self.cache.is_finished:
            return self.windows(indices)
        return self.split.windows(self._era_order(indices, epoch=0, epoch_size=None))

    def _wait_for_examples(self, count: int) -> None:
        # The last example's window ends one token into the next window.
        windows = int(self.split.windows(np.array([count - 1]))[0]) + 1
        self.cache.wait_until(
            lambda: self.available_examples() >= count,
            f"{count} examples of {self.seq_len + 1} tokens",
            tokens_needed=windows * self.seq_len + 1,
        )

    def _finished_order(self, indices: np.ndarray) -> np.ndarray:
        size = len(self)
        epochs, positions = np.divmod(indices, size)
        if self.shuffle == "none":
            return positions
        result = np.empty_like(positions)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            if self.shuffle == "feistel":
                result[chosen] = FeistelPermutation(size, (self.seed, int(epoch)))(positions[chosen])
            else:
                result[chosen] = self._era_order(positions[chosen], epoch=int(epoch), epoch_size=size)
        return result

    def _era_order(self, positions: np.ndarray, epoch: int, epoch_size: int | None) -> np.ndarray:
        eras, offsets = np.divmod(positions, self.era_windows)
        result = np.empty_like(positions)
        for era in np.unique(eras):
            start = int(era) * self.era_windows
            # Only the last era of a finished epoch can be shorter than era_windows.
            length = self.era_windows if epoch_size is None else min(self.era_windows, epoch_size - start)
            chosen = eras == era
            permutation = FeistelPermutation(length, (self.seed, epoch, int(era), 0x657261))
            result[chosen] = start + permutation(offsets[chosen])
        return result

    @property
    def has_loss_mask(self) -> bool:
        """True when examples carry a ``loss_mask`` (the cache was built from chat/prompt-completion data)."""
        return self.cache.has_loss_mask

    def examples(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Examples ``indices`` of the stream: ``tokens`` and ``segment_ids``, both ``[len(indices), seq_len + 1]``
        int32 (waits for tokens not committed yet), and ``loss_mask`` (int32 0/1, same shape: is the
        token a training target) when the cache stores one."""
        windows = self.windows(indices)
        width = self.seq_len + 1
        tokens = np.empty((len(windows), width), np.int32)
        segment_ids = np.empty((len(windows), width), np.int32)
        loss_mask = np.empty((len(windows), width), np.int32) if self.has_loss_mask else None
        offsets = np.arange(width, dtype=np.int64)
        for row, window in enumerate(windows):
            start = int(window) * self.seq_len
            tokens[row] = self.cache.read(start, start + width)
            ends = self.cache.document_ends(start, start + width)
            segment_ids[row] = np.searchsorted(ends, start + offsets, side="right")
            if loss_mask is not None:
                loss_mask[row] = self.cache.read_loss_mask(start, start + width)
        if loss_mask is None:
            return {"tokens": tokens, "segment_ids": segment_ids}
        return {"tokens": tokens, "segment_ids": segment_ids, "loss_mask": loss_mask}

    def batch(
        self, step: int, batch_size: int, host_index: int = 0, host_count: int = 1
    ) -> dict[str, np.ndarray]:
        """This host's rows of the global batch of ``step`` (see ``host_rows``).

        Args:
            step: the training step (0-based).
            batch_size: the global batch size (rows over all hosts).
            host_index: this host's index in ``[0, host_count)``.
            host_count: the number of hosts sharing the batch; must divide ``batch_size``.

        Returns:
            ``tokens`` and ``segment_ids``, both ``[batch_size // host_count, seq_len + 1]`` int32, and
            ``loss_mask`` of the same shape when the cache stores one (see ``examples``).

        Raises:
            ValueError: see ``host_rows``.
        """
        return self.examples(host_rows(step, batch_size, host_index, host_count))
