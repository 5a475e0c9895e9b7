"""From the ``data:`` section to datasets: corpus, tokenizer, token cache, train and validation splits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from halyard.data import (
    BadRecordError,
    CacheMismatchError,
    DataInputError,
    ExampleError,
    ExampleFormat,
    LMDataset,
    MissingFieldError,
    PreferenceDataset,
    SourceFormatError,
    SourceNotFoundError,
    TokenCache,
    TokenizerLoadError,
    TokenizerNotFoundError,
    UnreadableShardError,
    build_cache,
    load_tokenizer,
)
from halyard.shard import process_index
from halyard.train.checkpoint.process_agreement import broadcast_from_process_zero, true_on_any_process
from halyard.train.config.errors import ConfigError
from halyard.train.corpora.python_stdlib import BUILTIN_CORPORA, write_python_stdlib_corpus
from halyard.train.corpora.tokenizer import train_bpe_tokenizer
from halyard.train.mixture.batches import SourceMixture
from halyard.train.mixture.config import in_source_terms, mixture_sources
from halyard.train.run_config import DataConfig
from halyard.train.user_errors import RunFailure, one_line


@dataclass
class PreparedData:
    """The datasets of a run and what produced them (for ``data.mixture``: the mixed rows, each source's
    validation split by name, and the first source's cache)."""

    train: LMDataset | SourceMixture
    validation: LMDataset | dict[str, LMDataset] | None
    tokenizer_path: str
    cache: TokenCache


def hf_tokenizer_folder(init: str) -> str | None:
    """The folder of ``trainer.init: hf:FOLDER`` when it holds a tokenizer.json, else None."""
    if not init.startswith("hf:"):
        return None
    folder = init.removeprefix("hf:")
    return folder if (Path(folder) / "tokenizer.json").is_file() else None


def tokenizer_path_of(config: DataConfig, run_dir: Path, *, init: str = "auto") -> str:
    """Where the run's tokenizer is: ``data.tokenizer`` (a tokenizer.json or a folder), else the folder of
    ``trainer.init: hf:FOLDER`` when it holds one, else the one trained for a ``builtin_corpus``."""
    work_dir = Path(config.cache_dir) if config.cache_dir else run_dir / "cache"
    return config.tokenizer or hf_tokenizer_folder(init) or str(work_dir / "corpus" / "tokenizer.json")


def load_run_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at ``path`` (a tokenizer.json or a tokenizer folder), read as the token cache reads it:
    the one loader of the cache, the evaluator, sampling and ``halyard generate``.

    Raises:
        TokenizerNotFoundError, TokenizerLoadError: nothing there, or not a tokenizer (the path is named).
    """
    return load_tokenizer(path).build()


def check_data_section(config: DataConfig, *, init: str = "auto") -> str | None:
    """Check what the ``data:`` section needs before anything is read; return the tokenizer to load
    now (None when one is trained for a ``builtin_corpus``).

    Raises:
        ConfigError: sources and builtin_corpus both or neither set, an unknown corpus, no tokenizer; a
            source of ``data.mixture`` whose tokenizer would be trained on it (give data.tokenizer).
    """
    if config.mixture.sources:
        return _check_mixture_sources(config, init)
    if config.builtin_corpus is not None:
        if config.sources:
            raise ConfigError("data.sources and data.builtin_corpus are exclusive: set one of them")
        if config.builtin_corpus not in BUILTIN_CORPORA:
            raise ConfigError(
                f"data.builtin_corpus={config.builtin_corpus!r}: known corpora are {', '.join(BUILTIN_CORPORA)}"
            )
        return config.tokenizer or hf_tokenizer_folder(init)
    if not config.sources:
        raise ConfigError("data.sources is empty: give paths/URLs of text shards, or data.builtin_corpus")
    tokenizer = config.tokenizer or hf_tokenizer_folder(init)
    if tokenizer is None:
        raise ConfigError(
            "data.tokenizer is not set: give a tokenizer.json file or a tokenizer folder (or start from "
            "trainer.init: hf:FOLDER with FOLDER holding tokenizer.json)"
        )
    return tokenizer


def _check_mixture_sources(config: DataConfig, init: str) -> str:
    """Check each source as its own ``data:`` section; they share one tokenizer, which must be given."""
    tokenizers = []
    for name, source in mixture_sources(config).items():
        try:
            tokenizer = check_data_section(source, init=init)
        except ConfigError as error:
            raise ConfigError(in_source_terms(str(error), name)) from error
        if tokenizer is None:
            raise ConfigError(
                f"data.mixture.sources.{name}.builtin_corpus: every source of a mixture is read with one "
                "tokenizer; give it in data.tokenizer"
            )
        tokenizers.append(tokenizer)
    return tokenizers[0]


def _sources_and_tokenizer(config: DataConfig, work_dir: Path, init: str) -> tuple[list[Any], str]:
    tokenizer = check_data_section(config, init=init)
    if config.builtin_corpus is not None:
        shards = write_python_stdlib_corpus(work_dir / "corpus", config.max_documents)
        tokenizer = tokenizer or str(
            train_bpe_tokenizer(shards, work_dir / "corpus" / "tokenizer.json", config.tokenizer_vocab_size)
        )
        return [str(s) for s in shards], tokenizer
    assert tokenizer is not None
    return list(config.sources), tokenizer


# What a data error's fix is called in the run config (the data package names its own arguments).
_CONFIG_KEYS = (
    (MissingFieldError, "data.text_field"),
    (BadRecordError, "data.strict"),
    (CacheMismatchError, "data.cache_dir (another folder, or delete this one)"),
    (ExampleError, "data.format and its field names"),
    ((SourceNotFoundError, SourceFormatError, UnreadableShardError), "data.sources"),
    ((TokenizerLoadError, TokenizerNotFoundError), "data.tokenizer"),
    (DataInputError, "data"),
)


def _in_config_terms(error: DataInputError) -> ConfigError:
    key = next(key for kind, key in _CONFIG_KEYS if isinstance(error, kind))
    if isinstance(error, MissingFieldError) and error.option:  # the data: section's key has the same name
        key = f"data.{error.option}"
    return ConfigError(f"{one_line(str(error))} [run config: {key}]")


def example_format_of(config: DataConfig) -> ExampleFormat:
    """The cache's `ExampleFormat` from the ``data:`` section (``format`` and the chat/prompt fields)."""
    return ExampleFormat(
        kind=config.format,
        messages_field=config.messages_field,
        role_field=config.role_field,
        content_field=config.content_field,
        prompt_field=config.prompt_field,
        completion_field=config.completion_field,
        chosen_field=config.chosen_field,
        rejected_field=config.rejected_field,
        chat_template=config.chat_template,
        system_marker=config.system_marker,
        user_marker=config.user_marker,
        assistant_marker=config.assistant_marker,
        end_of_turn=config.end_of_turn,
    )


def prepare_data(
    config: DataConfig, run_dir: Path, *, is_main: bool = True, progress: bool = True, init: str = "auto"
) -> PreparedData:
    """Build (or reuse) the token cache and open the train and validation splits.

    Process 0 writes the corpus, tokenizer and cache; the others wait at a barrier and then read. A cache
    built with another tokenizer or BOS/EOS policy is refused by the builder, naming the difference. With
    ``data.format`` chat or prompt_completion the cache stores a loss mask and every batch carries
    ``loss_mask[B, S+1]`` (1 on the assistant/completion tokens), which the loss weights tokens by; with
    preference the datasets are `PreferenceDataset` pairs (chosen and rejected sequences with masks).

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
    if config.mixture.sources:  # every source's cache, then the mixture of them
        from halyard.train.mixture.build import prepare_mixture

        return prepare_mixture(config, run_dir, is_main=is_main, progress=progress, init=init)
    work_dir = Path(config.cache_dir) if config.cache_dir else run_dir / "cache"
    cache_path = str(work_dir / "tokens")

    def build() -> str:
        sources, tokenizer_path = _sources_and_tokenizer(config, work_dir, init)
        build_cache(sources, tokenizer_path, cache_path, progress=progress, **build_options(config, run_dir))
        return tokenizer_path

    # Also the barrier after the build: the other processes learn that process 0 failed instead of
    # waiting for it until the heartbeat timeout.
    tokenizer_path = agreeing(build if is_main else lambda: "")
    if not tokenizer_path:
        tokenizer_path = tokenizer_path_of(config, run_dir, init=init)
    return open_datasets(config, TokenCache.open(cache_path), tokenizer_path)


def build_options(config: DataConfig, run_dir: Path) -> dict[str, Any]:
    """The ``build_cache`` arguments that the ``data:`` section sets (fields, format, strictness, workers).

    Shards inside the run directory (or inside ``data.cache_dir`` when that is elsewhere: the builtin
    corpus) are recorded by their path inside it, so a moved or copied run directory reuses its cache.
    """
    work_dir = Path(config.cache_dir) if config.cache_dir else run_dir / "cache"
    inside = work_dir.resolve().is_relative_to(run_dir.resolve())
    return {
        "text_field": config.text_field,
        "example_format": example_format_of(config),
        "strict": config.strict,
        "num_workers": config.num_workers,
        "relative_to": str(run_dir if inside else work_dir),
    }


def agreeing(action: Callable[[], Any]) -> Any:
    """Run ``action`` on this process; if it failed on any process, fail on all of them (a collective).

    Every process meets the same bad source or tokenizer: process 0 raises its error (in the run config's
    terms), the others a `RunFailure` pointing at it.
    """
    failure: BaseException | None = None
    result = None
    try:
        result = action()
    except DataInputError as error:
        failure = _in_config_terms(error)
        failure.__cause__ = error
    except Exception as error:
        failure = error
    if true_on_any_process(failure is not None):
        zero_failed = broadcast_from_process_zero(failure is not None)
        if failure is not None and (process_index() == 0 or not zero_failed):
            raise failure
        who = "process 0" if zero_failed else "another process"
        raise RunFailure(
            f"{who} stopped while preparing the data (its error, printed by {who}, names the cause)"
        )
    return result


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
