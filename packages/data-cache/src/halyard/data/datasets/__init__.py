"""Datasets: LM windows with segment ids, preference pairs, keyed shuffles, validation split, mixtures, pure
batches by step."""

from halyard.data.datasets.manifest import DataManifest
from halyard.data.datasets.mixture import MixtureDataset, block_counts
from halyard.data.datasets.permutation import FeistelPermutation
from halyard.data.datasets.preferences import PreferenceDataset
from halyard.data.datasets.split import WindowSplit
from halyard.data.datasets.windows import LMDataset, host_rows

__all__ = [
    "DataManifest",
    "FeistelPermutation",
    "LMDataset",
    "MixtureDataset",
    "PreferenceDataset",
    "WindowSplit",
    "block_counts",
    "host_rows",
]
