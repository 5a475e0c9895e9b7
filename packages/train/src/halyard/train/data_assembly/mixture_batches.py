"""A mixture's training batches: `halyard.data.MixtureDataset` rows, each labelled with its source."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from halyard.data import DataManifest, LMDataset, MixtureDataset
from halyard.train.mixture.config import (
    ROWS_PER_BLOCK,
    MixtureConfig,
    block_rows,
    source_order,
    weight_schedule,
)


class SourceMixture:
    """The rows of several sources in the proportions of ``data.mixture``, as the trainer's loader reads them.

    A batch is a pure function of (every source's manifest, the weight schedule, the seed, the step), as
    for one source. The block size in rows depends on the batch size (`block_rows`), so the mixture is
    built for the batch size of the first request.

    Args:
        datasets: each source's training split, by name (indexed in `source_order`).
        mixture: the ``data.mixture`` section (weights, schedule, block size).
        seed: ``data.seed``: chooses where each source's rows sit inside each block.
    """

    def __init__(self, datasets: Mapping[str, LMDataset], mixture: MixtureConfig, seed: int) -> None:
        self.names = source_order(mixture)
        self.datasets = {name: datasets[name] for name in self.names}
        self.mixture = mixture
        self.schedule = weight_schedule(mixture)
        self.seed = seed
        self._by_batch_size: dict[int, MixtureDataset] = {}

    @property
    def manifest(self) -> DataManifest:
        """What decides every batch: each source's manifest, the schedule, the seed and the block size."""
        return DataManifest.create(
            "mixture",
            {
                "components": {name: dataset.manifest.to_dict() for name, dataset in self.datasets.items()},
                "schedule": [[step, weights] for step, weights in self.schedule],
                "seed": self.seed,
                "block_size": self.mixture.block_size or f"auto (about {ROWS_PER_BLOCK} rows)",
            },
        )

    def rows_for(self, batch_size: int) -> MixtureDataset:
        """The `MixtureDataset` for global batches of ``batch_size`` rows."""
        mixed = self._by_batch_size.get(batch_size)
        if mixed is None:  # two loader threads may both build it: the same object either way
            block_size = block_rows(self.mixture, batch_size)
            mixed = MixtureDataset(self.datasets, self.schedule, seed=self.seed, block_size=block_size)
            self._by_batch_size[batch_size] = mixed
        return mixed

    def batch(
        self, step: int, batch_size: int, host_index: int = 0, host_count: int = 1
    ) -> dict[str, np.ndarray]:
        """This host's rows of the global batch of ``step`` (see ``MixtureDataset.batch``), plus
        ``source_one_hot`` int32 ``[rows, sources]``: 1 in the column of each row's source, which the
        compiled step sums the loss per source with (``source`` holds the same as an index)."""
        batch = self.rows_for(batch_size).batch(step, batch_size, host_index, host_count)
        batch["source_one_hot"] = np.eye(len(self.names), dtype=np.int32)[batch["source"]]
        return batch
