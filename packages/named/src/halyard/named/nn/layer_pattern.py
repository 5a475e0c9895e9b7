"""Layers that differ only by a static setting (their attention window, their rotary base), grouped so
that a scan can still run them: `repeating_runs` splits the per-layer settings into runs that repeat a
short pattern (Gemma 2 alternates two kinds of layers, Gemma 3 repeats five local layers and a global one).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple


class Run(NamedTuple):
    """Layers ``start .. stop - 1`` repeat ``kinds[start : start + period]`` ``(stop - start) // period`` times."""

    start: int
    stop: int
    period: int

    @property
    def repeats(self) -> int:
        return (self.stop - self.start) // self.period


def _covered(kinds: Sequence[Hashable], start: int, period: int) -> int:
    """How many layers from ``start`` on repeat the pattern ``kinds[start : start + period]`` whole."""
    length = 0
    while start + length < len(kinds) and kinds[start + length] == kinds[start + length % period]:
        length += 1
    return length - length % period


def repeating_runs(kinds: Sequence[Hashable]) -> list[Run]:
    """Split the layers into runs, each repeating one pattern, covering as many layers per run as possible.

    At each start the period that covers the most layers in at least two repeats wins (ties: the shortest
    period; a single layer when no pattern repeats), so identical layers are one run of period 1,
    ``[local, global] * 13`` one run of period 2, and Gemma 3's 26 layers (five local, one global) a run of
    period 6 over 24 layers and one of period 1 over the last two.

    Args:
        kinds: one hashable static setting per layer.
    """
    runs: list[Run] = []
    start = 0
    while start < len(kinds):
        best_period, best_length = 1, _covered(kinds, start, 1)
        for period in range(2, (len(kinds) - start) // 2 + 1):
            length = _covered(kinds, start, period)
            if length >= 2 * period and length > best_length:
                best_period, best_length = period, length
        runs.append(Run(start, start + best_length, best_period))
        start += best_length
    return runs
