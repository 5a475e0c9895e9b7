"""The train/validation split of windows: one keyed window per block goes to validation.

The rule needs no total size, so it works while the cache is still being built, and each split maps its
own index to a window in O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from halyard.data.datasets.permutation import _mix

SPLITS = ("all", "train", "validation")


@dataclass(frozen=True)
class WindowSplit:
    """Which windows belong to a split.

    Attributes:
        split: ``"all"`` (every window), ``"train"`` or ``"validation"``.
        block: with ``train``/``validation``, one window in every ``block`` windows is held out for
            validation (``block = round(1 / validation_fraction)``).
        seed: chooses the held-out position inside each block.
    """

    split: str
    block: int
    seed: int

    @classmethod
    def create(cls, split: str, validation_fraction: float, seed: int) -> WindowSplit:
        """Build the split for a fraction of held-out windows.

        Raises:
            ValueError: an unknown split, or a fraction outside ``(0, 0.5]`` when a split is chosen.
        """
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not known; use one of {SPLITS}")
        if split == "all":
            return cls("all", 1, seed)
        if not 0.0 < validation_fraction <= 0.5:
            raise ValueError(
                f"split={split!r} needs validation_fraction in (0, 0.5], got {validation_fraction}; "
                "use split='all' to read every window"
            )
        return cls(split, max(2, round(1.0 / validation_fraction)), seed)

    def _held_out_position(self, blocks: np.ndarray) -> np.ndarray:
        keyed = blocks.astype(np.uint64) ^ np.uint64(self.seed * 0x9E3779B97F4A7C15 % 2**64)
        return (_mix(keyed) % np.uint64(self.block)).astype(np.int64)

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """Window numbers of split indices ``indices`` (int64 array)."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.split == "all":
            return indices
        if self.split == "validation":
            return indices * self.block + self._held_out_position(indices)
        per_block = self.block - 1
        blocks, offsets = np.divmod(indices, per_block)
        held_out = self._held_out_position(blocks)
        return blocks * self.block + offsets + (offsets >= held_out)

    def count(self, num_windows: int) -> int:
        """How many of the first ``num_windows`` windows belong to this split (a contiguous index range)."""
        if self.split == "all":
            return num_windows
        full_blocks, remainder = divmod(num_windows, self.block)
        last_held_out = int(self._held_out_position(np.array([full_blocks]))[0])
        validation = full_blocks + (1 if last_held_out < remainder else 0)
        if self.split == "validation":
            return validation
        # Train windows in a partial last block are usable only up to the held-out one, or all if it is past.
        train_full = full_blocks * (self.block - 1)
        return train_full + (remainder - 1 if last_held_out < remainder else remainder)
