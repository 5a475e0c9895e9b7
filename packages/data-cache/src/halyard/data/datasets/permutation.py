"""A keyed pseudo-random permutation of ``range(size)`` that maps any index in O(1) (Feistel network)."""

from __future__ import annotations

import numpy as np

_ROUNDS = 6


def _mix(values: np.ndarray) -> np.ndarray:
    # splitmix64 finalizer: a fast, well-distributed 64-bit mixing function (wrapping arithmetic).
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


class FeistelPermutation:
    """A bijection of ``[0, size)`` chosen by ``key``; ``perm(indices)`` maps a whole array at once.

    A balanced Feistel network permutes the smallest even-bit power of two that covers ``size``; indices
    that land outside ``[0, size)`` are mapped again (cycle walking), which keeps it a bijection of
    ``[0, size)``. The domain is under 4x ``size``, so a few rounds of walking suffice.
    """

    def __init__(self, size: int, key: tuple[int, ...]) -> None:
        """Args:
        size: the number of elements permuted (at least 1).
        key: integers choosing the permutation (e.g. ``(seed, epoch)``).

        Raises:
            ValueError: ``size`` below 1.
        """
        if size < 1:
            raise ValueError(f"a permutation needs at least one element, got size={size}")
        self.size = size
        half_bits = max(1, ((size - 1).bit_length() + 1) // 2)
        self._half_bits = np.uint64(half_bits)
        self._half_mask = np.uint64((1 << half_bits) - 1)
        entropy = np.random.SeedSequence([abs(int(part)) for part in key] + [size, 0x4665697374656C])
        self._round_keys = entropy.generate_state(_ROUNDS, dtype=np.uint64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        left = values >> self._half_bits
        right = values & self._half_mask
        for round_key in self._round_keys:
            left, right = right, left ^ (_mix(right ^ round_key) & self._half_mask)
        return (left << self._half_bits) | right

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        """The images of ``indices`` (any integer array with values in ``[0, size)``), as int64."""
        values = np.asarray(indices, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.size):
            raise IndexError(
                f"permutation indices must be in [0, {self.size}), got {values.min()}..{values.max()}"
            )
        result = self._encrypt(values.astype(np.uint64))
        outside = result >= np.uint64(self.size)
        while outside.any():
            result[outside] = self._encrypt(result[outside])
            outside = result >= np.uint64(self.size)
        return result.astype(np.int64)
