"""A mixture's data: one token cache per source (built beside training, as for one source), the mixed
training batches, and each source's validation split."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from halyard.data import DataInputError, LMDataset
from halyard.train.config.errors import ConfigError
from halyard.train.data_assembly.background_build import BackgroundBuild
from halyard.train.data_assembly.data_errors import config_error_for
from halyard.train.data_assembly.data_section import check_data_section, work_dir_of
from halyard.train.data_assembly.datasets import PreparedData
from halyard.train.data_assembly.mixture_batches import SourceMixture
from halyard.train.data_assembly.single_source import prepare_source, start_source_build
from halyard.train.mixture.config import in_source_terms, mixture_sources
from halyard.train.run_config import DataConfig
from halyard.train.user_errors import one_line


def source_data_configs(config: DataConfig, run_dir: Path) -> dict[str, DataConfig]:
    """Each source's ``data:`` section, its cache in ``<data.cache_dir or run_dir/cache>/<name>`` unless the
    source names its own ``cache_dir``."""
    work_dir = work_dir_of(config, run_dir)
    return {
        name: source
        if "cache_dir" in config.mixture.sources[name]
        else dataclasses.replace(source, cache_dir=str(work_dir / name))
        for name, source in mixture_sources(config).items()
    }


def _named(name: str, action: Callable[[], Any]) -> Any:
    """``action()``, its `ConfigError` naming this source's keys (``data.mixture.sources.<name>.text_field``)."""
    try:
        return action()
    except ConfigError as error:
        raise ConfigError(in_source_terms(str(error), name)) from error


def mixture_data(config: DataConfig, prepared: dict[str, PreparedData]) -> PreparedData:
    """The run's data from each source's: mixed training rows, validation splits by source (None when no
    source holds one out)."""
    train: dict[str, LMDataset] = {}
    validation: dict[str, LMDataset] = {}
    for name, data in prepared.items():
        assert isinstance(data.train, LMDataset), "a mixture's sources are windows of tokens"
        train[name] = data.train
        if isinstance(data.validation, LMDataset):
            validation[name] = data.validation
    first = next(iter(prepared.values()))
    return PreparedData(
        train=SourceMixture(train, config.mixture, config.seed),
        validation=validation or None,
        tokenizer_path=first.tokenizer_path,
        cache=first.cache,
    )


def prepare_mixture(
    config: DataConfig, run_dir: Path, *, is_main: bool = True, progress: bool = True, init: str = "auto"
) -> PreparedData:
    """`prepare_data` for ``data.mixture``: build (or reuse) every source's cache, then open them."""
    check_data_section(config, init=init)
    prepared = {}
    for name, source in source_data_configs(config, run_dir).items():
        prepare = functools.partial(
            prepare_source, source, run_dir, is_main=is_main, progress=progress, init=init
        )
        prepared[name] = _named(name, prepare)
    return mixture_data(config, prepared)


def start_mixture_build(
    config: DataConfig, run_dir: Path, *, init: str = "auto"
) -> tuple[PreparedData, MixtureBuild]:
    """`start_background_build` for ``data.mixture``: every source's cache is built beside training.

    Raises:
        ConfigError: a bad source, record or tokenizer, named ``data.mixture.sources.<name>.<key>``.
    """
    check_data_section(config, init=init)
    prepared: dict[str, PreparedData] = {}
    builds: dict[str, BackgroundBuild] = {}
    try:
        for name, source in source_data_configs(config, run_dir).items():
            start = functools.partial(start_source_build, source, run_dir, init=init)
            prepared[name], builds[name] = _named(name, start)
    except BaseException:
        MixtureBuild(builds).close()
        raise
    return mixture_data(config, prepared), MixtureBuild(builds)


@dataclasses.dataclass
class MixtureBuild:
    """The cache builds of a mixture's sources, seen by the training loop as one (`BackgroundBuild`'s methods).

    Attributes:
        builds: each source's build, by name.
    """

    builds: dict[str, BackgroundBuild]

    def metrics(self) -> dict[str, float]:
        """``data/build_*`` summed over the sources (``data/build_finished``: 1 once all are), and each
        source's ``data/<name>/build_tokens`` and ``data/<name>/build_finished``."""
        values: dict[str, float] = {}
        finished = 1.0
        for name, build in self.builds.items():
            own = build.metrics()
            for key, value in own.items():
                if key != "data/build_finished":
                    values[key] = values.get(key, 0.0) + value
            finished = min(finished, own["data/build_finished"])
            values[f"data/{name}/build_tokens"] = own["data/build_tokens"]
            values[f"data/{name}/build_finished"] = own["data/build_finished"]
        values["data/build_finished"] = finished
        return values

    def next_batch(self, batches: Iterator[dict[str, np.ndarray]], log: Any) -> dict[str, np.ndarray]:
        """The loader's next batch (see `BackgroundBuild.next_batch`).

        Raises:
            ConfigError: a source's build failed on a bad source or record (names that source's key).
        """
        for name, build in self.builds.items():
            _named(name, build.raise_build_error)
        try:
            with log.data_wait_timer():
                return next(batches)
        except DataInputError as error:
            raise ConfigError(in_source_terms(one_line(str(config_error_for(error))), "<name>")) from error

    def close(self) -> None:
        """Stop every source's build that is still running (see `BackgroundBuild.close`)."""
        for build in self.builds.values():
            build.close()
