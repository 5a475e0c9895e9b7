"""One source's data (a ``data:`` section without ``mixture``): its token cache built before training or
beside it, and its splits opened. A mixture builds each of its sources with these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from halyard.data import BuildHandle, TokenCache, build_cache
from halyard.shard import process_count, process_index
from halyard.train.data_assembly.background_build import BackgroundBuild, when_training_starts
from halyard.train.data_assembly.data_errors import agreeing, config_error_for
from halyard.train.data_assembly.data_section import (
    build_options,
    sources_and_tokenizer,
    token_cache_of,
    work_dir_of,
)
from halyard.train.data_assembly.datasets import PreparedData, open_datasets
from halyard.train.data_assembly.tokenizer import tokenizer_path_of
from halyard.train.run_config import DataConfig

# Tokenizer processes yield the CPU to the training process (compilation, steps, batches) on its host.
_BUILD_NICENESS = 10


def prepare_source(
    config: DataConfig, run_dir: Path, *, is_main: bool = True, progress: bool = True, init: str = "auto"
) -> PreparedData:
    """`prepare_data` for one source: process 0 builds (or reuses) the cache, then every process opens it.

    Raises:
        ConfigError: bad sources, records or tokenizer, named with the run config's key.
    """
    work_dir = work_dir_of(config, run_dir)
    cache_path = str(token_cache_of(config, run_dir))

    def build() -> str:
        sources, tokenizer_path = sources_and_tokenizer(config, work_dir, init)
        build_cache(sources, tokenizer_path, cache_path, progress=progress, **build_options(config, run_dir))
        return tokenizer_path

    # Also the barrier after the build: the other processes learn that process 0 failed instead of
    # waiting for it until the heartbeat timeout.
    tokenizer_path = agreeing(build if is_main else lambda: "")
    if not tokenizer_path:
        tokenizer_path = tokenizer_path_of(config, run_dir, init=init)
    return open_datasets(config, TokenCache.open(cache_path), tokenizer_path)


def start_source_build(
    config: DataConfig, run_dir: Path, *, init: str = "auto"
) -> tuple[PreparedData, BackgroundBuild]:
    """`start_background_build` for one source: start its cache build beside training, open its splits.

    Raises:
        ConfigError: bad sources, records or tokenizer, named with the run config's key.
        RunFailure: another process failed to start its build (its own error names the cause).
    """
    work_dir = work_dir_of(config, run_dir)
    cache_path = str(token_cache_of(config, run_dir))
    process, processes = process_index(), process_count()
    sources: list[Any] = []
    tokenizer_path = ""
    # The builtin corpus and its tokenizer are written once, by process 0, before the others read them.
    first = config.builtin_corpus is None or process == 0
    if first:
        sources, tokenizer_path = agreeing(lambda: sources_and_tokenizer(config, work_dir, init))
    else:
        agreeing(lambda: None)
        sources, tokenizer_path = sources_and_tokenizer(config, work_dir, init)
    builds = config.builder == "local" or process == 0
    local = config.builder == "local"

    def start() -> BuildHandle | None:
        if not builds:
            return None
        handle = build_cache(
            sources,
            tokenizer_path,
            cache_path,
            builder=config.builder,
            ray_address=config.ray_address,
            progress=False,
            background=True,
            niceness=_BUILD_NICENESS,
            host_index=process if local else 0,
            host_count=processes if local else 1,
            **build_options(config, run_dir),
        )
        assert isinstance(handle, BuildHandle)
        return handle

    handle = agreeing(start)
    cache = handle.cache if handle is not None else TokenCache.open(cache_path)
    starts = when_training_starts(config.shuffle, config.era_windows)
    build = BackgroundBuild(cache, handle, config_error_for, first_step=starts)
    return open_datasets(config, cache, tokenizer_path), build
