"""The run's datasets: the train and validation splits of a token cache, and what produced them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halyard.data import LMDataset, PreferenceDataset, TokenCache
from halyard.train.data_assembly.mixture_batches import SourceMixture
from halyard.train.run_config import DataConfig


@dataclass
class PreparedData:
    """The datasets of a run and what produced them (for ``data.mixture``: the mixed rows, each source's
    validation split by name, and the first source's cache)."""

    train: LMDataset | SourceMixture
    validation: LMDataset | dict[str, LMDataset] | None
    tokenizer_path: str
    cache: TokenCache


def open_datasets(config: DataConfig, cache: TokenCache, tokenizer_path: str) -> PreparedData:
    """The train and validation splits of ``cache`` (finished or still being built) as ``data:`` says:
    windows (`LMDataset`), or pairs (`PreferenceDataset`) for ``data.format: preference``."""
    split = "train" if config.validation_fraction > 0 else "all"
    common: dict[str, Any] = {
        "seed": config.seed,
        "shuffle": config.shuffle,
        "era_windows": config.era_windows,
        "validation_fraction": config.validation_fraction,
    }
    dataset = PreferenceDataset if config.format == "preference" else LMDataset
    train = dataset(cache, config.seq_len, split=split, **common)
    validation = dataset(cache, config.seq_len, split="validation", **common) if split == "train" else None
    return PreparedData(train, validation, tokenizer_path, cache)
