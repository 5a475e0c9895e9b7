"""Weighted mixtures of datasets, deterministic per block of rows, with weights that change by step."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from halyard.data.datasets.manifest import DataManifest
from halyard.data.datasets.permutation import FeistelPermutation
from halyard.data.datasets.windows import LMDataset, host_rows


def block_counts(weights: Mapping[str, float], names: Sequence[str], block_size: int) -> np.ndarray:
    """Rows per component in one block: ``weight * block_size`` rounded by largest remainder (sums to the block).

    Raises:
        ValueError: a negative weight, an unknown name, or all weights zero.
    """
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"weights name unknown datasets {unknown}; the mixture has {list(names)}")
    raw = np.array([float(weights.get(name, 0.0)) for name in names])
    if (raw < 0).any() or raw.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {dict(weights)}")
    exact = raw / raw.sum() * block_size
    counts = np.floor(exact).astype(np.int64)
    remainders = exact - counts
    # Ties go to the earlier component, so the rounding is reproducible.
    order = np.lexsort((np.arange(len(names)), -remainders))
    counts[order[: block_size - int(counts.sum())]] += 1
    return counts


class MixtureDataset:
    """Rows drawn from several datasets in fixed proportions per block.

    Rows are grouped in blocks of ``block_size``; in every block each component gets exactly its rounded
    share of rows (``block_counts``), at keyed pseudo-random positions inside the block, and reads its own
    examples in order (each component applies its own shuffle). Row ``r`` of the mixture is therefore a
    pure function of the seed, the schedule and ``r``. Weights may change at given steps: the schedule is
    a list of ``(start_step, weights)``; a change must fall on a block boundary for the batch size used.
    """

    def __init__(
        self,
        datasets: Mapping[str, LMDataset],
        weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
        *,
        seed: int = 0,
        block_size: int = 256,
    ) -> None:
        """Args:
        datasets: the components by name.
        weights: ``{name: weight}`` for constant weights, or ``[(start_step, {name: weight}), ...]`` with
            the first start step 0 and increasing steps.
        seed: chooses the positions of each component inside each block.
        block_size: rows per block.

        Raises:
            ValueError: no datasets, bad weights, or a schedule that does not start at step 0 or is not
                increasing.
        """
        if not datasets:
            raise ValueError("a mixture needs at least one dataset")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.datasets = dict(datasets)
        self.names = list(self.datasets)
        self.seed = seed
        self.block_size = block_size
        schedule = [(0, weights)] if isinstance(weights, Mapping) else [(int(s), w) for s, w in weights]
        steps = [step for step, _ in schedule]
        if not schedule or steps[0] != 0 or any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError(
                f"the weight schedule must start at step 0 with increasing steps, got steps {steps}"
            )
        self.schedule = [(step, dict(stage)) for step, stage in schedule]
        self._stage_counts = [block_counts(stage, self.names, block_size) for _, stage in self.schedule]

    @property
    def manifest(self) -> DataManifest:
        """The identity of the mixture: every component's manifest, the schedule, seed and block size."""
        return DataManifest.create(
            "mixture",
            {
                "components": {name: dataset.manifest.to_dict() for name, dataset in self.datasets.items()},
                "schedule": [[step, stage] for step, stage in self.schedule],
                "seed": self.seed,
                "block_size": self.block_size,
            },
        )

    def _stage_starts(self, batch_size: int) -> list[int]:
        starts = []
        for step, _ in self.schedule:
            row = step * batch_size
            if row % self.block_size:
                raise ValueError(
                    f"the weight change at step {step} falls inside a block: step * batch_size = {row} is not a "
                    f"multiple of block_size={self.block_size}; choose a block size dividing {row}"
                )
            starts.append(row // self.block_size)
        return starts

    def assignments(self, rows: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """For mixture rows ``rows``: the component index and the example index inside that component."""
        rows = np.asarray(rows, dtype=np.int64)
        stage_starts = self._stage_starts(batch_size)
        blocks, positions = np.divmod(rows, self.block_size)
        components = np.empty_like(rows)
        local = np.empty_like(rows)
        for block in np.unique(blocks):
            chosen = blocks == block
            stage = int(np.searchsorted(stage_starts, block, side="right")) - 1
            counts = self._stage_counts[stage]
            boundaries = np.cumsum(counts)
            slots = FeistelPermutation(self.block_size, (self.seed, int(block), 0x6D6978))(positions[chosen])
            component = np.searchsorted(boundaries, slots, side="right")
            rank = slots - (boundaries - counts)[component]
            earlier = np.zeros(len(self.names), np.int64)
            for index, start in enumerate(stage_starts):
                end = stage_starts[index + 1] if index + 1 < len(stage_starts) else None
                blocks_in_stage = max(0, (int(block) if end is None else min(int(block), end)) - start)
                earlier += blocks_in_stage * self._stage_counts[index]
            components[chosen] = component
            local[chosen] = earlier[component] + rank
        return components, local

    def batch(
        self, step: int, batch_size: int, host_index: int = 0, host_count: int = 1
    ) -> dict[str, np.ndarray]:
        """This host's rows of the global batch of ``step`` (same contract as ``LMDataset.batch``).

        Returns:
            ``tokens`` and ``segment_ids`` ``[batch_size // host_count, seq_len + 1]`` int32, and
            ``source`` ``[batch_size // host_count]`` int32 (the component index of each row). When some
            component stores a loss mask, also ``loss_mask`` (int32 0/1; all ones on rows of text
            components, whose every token is a target).

        Raises:
            ValueError: see ``host_rows``; components with different ``seq_len``.
        """
        lengths = {dataset.seq_len for dataset in self.datasets.values()}
        if len(lengths) != 1:
            raise ValueError(f"mixture components must share seq_len, got {sorted(lengths)}")
        rows = host_rows(step, batch_size, host_index, host_count)
        components, local = self.assignments(rows, batch_size)
        width = lengths.pop() + 1
        tokens = np.empty((len(rows), width), np.int32)
        segment_ids = np.empty((len(rows), width), np.int32)
        # Decided by the components, not the rows of this step: every batch has the same keys.
        with_mask = any(dataset.has_loss_mask for dataset in self.datasets.values())
        loss_mask = np.ones((len(rows), width), np.int32)
        for index, name in enumerate(self.names):
            chosen = components == index
            if chosen.any():
                part = self.datasets[name].examples(local[chosen])
                tokens[chosen] = part["tokens"]
                segment_ids[chosen] = part["segment_ids"]
                if "loss_mask" in part:
                    loss_mask[chosen] = part["loss_mask"]
        batch = {"tokens": tokens, "segment_ids": segment_ids, "source": components.astype(np.int32)}
        if with_mask:
            batch["loss_mask"] = loss_mask
        return batch
