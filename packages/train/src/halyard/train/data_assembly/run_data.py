"""The run's data from its ``data:`` section: one source (`single_source`) or a mixture of them
(`mixture_build`), built before training or beside it."""

from __future__ import annotations

from pathlib import Path

from halyard.train.data_assembly.background_build import BackgroundBuild
from halyard.train.data_assembly.datasets import PreparedData
from halyard.train.data_assembly.mixture_build import MixtureBuild, prepare_mixture, start_mixture_build
from halyard.train.data_assembly.single_source import prepare_source, start_source_build
from halyard.train.run_config import DataConfig


def prepare_data(
    config: DataConfig, run_dir: Path, *, is_main: bool = True, progress: bool = True, init: str = "auto"
) -> PreparedData:
    """Build (or reuse) the token cache and open the train and validation splits.

    Process 0 writes the corpus, tokenizer and cache; the others wait at a barrier and then read. A cache
    built with another tokenizer or BOS/EOS policy is refused by the builder, naming the difference. With
    ``data.format`` chat or prompt_completion the cache stores a loss mask and every batch carries
    ``loss_mask[B, S+1]`` (1 on the assistant/completion tokens), which the loss weights tokens by; with
    preference the datasets are `PreferenceDataset` pairs (chosen and rejected sequences with masks).
    With ``data.mixture``, every source's cache, then the mixture of them (`prepare_mixture`).

    Args:
        config: the ``data:`` section.
        run_dir: the run directory (the cache goes to ``<run_dir>/cache`` unless ``data.cache_dir`` is set).
        is_main: whether this process builds.
        progress: show the builder's progress bar.
        init: ``trainer.init`` (an ``hf:FOLDER`` holding tokenizer.json is the default tokenizer).

    Raises:
        ConfigError: bad sources, records or tokenizer, named with the run config's key; also for
            errors raised inside the builder's worker processes.
    """
    prepare = prepare_mixture if config.mixture.sources else prepare_source
    return prepare(config, run_dir, is_main=is_main, progress=progress, init=init)


def start_background_build(
    config: DataConfig, run_dir: Path, *, init: str = "auto"
) -> tuple[PreparedData, BackgroundBuild | MixtureBuild]:
    """Start building the token cache beside training and open its train and validation splits at once.

    With ``data.builder=local`` every process tokenizes its share of the shards (shard ``i`` on process
    ``i % process_count``) into the one cache, which must be on a disk every process sees; with ``ray``,
    process 0 sends every shard to the Ray cluster. A ``builtin_corpus`` and its tokenizer are written by
    process 0 first. Bad sources, tokenizer or cache settings are found before this returns, on every
    process; a bad record found later fails the step that waits for it (or the next step).

    Args:
        config: the ``data:`` section.
        run_dir: the run directory (the cache goes to ``<run_dir>/cache`` unless ``data.cache_dir`` is set).
        init: ``trainer.init`` (an ``hf:FOLDER`` holding tokenizer.json is the default tokenizer).

    With ``data.mixture`` every source's cache is built so (`start_mixture_build`), and the batches mix them.

    Raises:
        ConfigError: bad sources, records or tokenizer, named with the run config's key.
        RunFailure: another process failed to start its build (its own error names the cause).
    """
    if config.mixture.sources:
        return start_mixture_build(config, run_dir, init=init)
    return start_source_build(config, run_dir, init=init)
