"""What the ``data:`` section says before anything is read: whether it is complete, where its files go, the
sources and tokenizer to build from, and the token cache builder's arguments."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from halyard.data import DataInputError, ExampleFormat
from halyard.data.sources import expand_urls
from halyard.train.config.errors import ConfigError
from halyard.train.corpora.bytes_tokenizer import tokenizer_file
from halyard.train.corpora.domains import BUILTIN_CORPORA
from halyard.train.corpora.tokenizer import train_bpe_tokenizer
from halyard.train.mixture.config import in_source_terms, mixture_sources
from halyard.train.run_config import DataConfig

TOKEN_CACHE_FOLDER = "tokens"
"""The token cache's folder inside the run's data folder (`work_dir_of`)."""


def work_dir_of(config: DataConfig, run_dir: Path) -> Path:
    """The folder of the run's data files (corpus, tokenizer, token cache): ``data.cache_dir``, else
    ``<run_dir>/cache``."""
    return Path(config.cache_dir) if config.cache_dir else run_dir / "cache"


def token_cache_of(config: DataConfig, run_dir: Path) -> Path:
    """The token cache of one source's ``data:`` section: ``<data.cache_dir or run_dir/cache>/tokens``."""
    return work_dir_of(config, run_dir) / TOKEN_CACHE_FOLDER


def hf_tokenizer_folder(init: str) -> str | None:
    """The folder of ``trainer.init: hf:FOLDER`` when it holds a tokenizer.json, else None."""
    if not init.startswith("hf:"):
        return None
    folder = init.removeprefix("hf:")
    return folder if (Path(folder) / "tokenizer.json").is_file() else None


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
        return _named_tokenizer(config) or hf_tokenizer_folder(init)
    if not config.sources:
        raise ConfigError("data.sources is empty: give paths/URLs of text shards, or data.builtin_corpus")
    _check_sources_hold_data(config.sources)
    tokenizer = _named_tokenizer(config) or hf_tokenizer_folder(init)
    if tokenizer is None:
        raise ConfigError(
            "data.tokenizer is not set: give a tokenizer.json file or a tokenizer folder (or start from "
            "trainer.init: hf:FOLDER with FOLDER holding tokenizer.json)"
        )
    return tokenizer


def _named_tokenizer(config: DataConfig) -> str | None:
    """``data.tokenizer`` as a file or folder (``bytes``: the shipped byte tokenizer), None when unset."""
    return tokenizer_file(config.tokenizer) if config.tokenizer else None


def _check_sources_hold_data(sources: list[str]) -> None:
    """Refuse sources that are all empty local files, before any file of the run is written.

    Raises:
        ConfigError: naming ``data.sources`` and the empty files.
    """
    try:
        files = expand_urls(list(sources))
    except DataInputError:
        return  # a pattern matching no file: the build reports it on every process, in the run config's terms
    local = [Path(file) for file in files if "://" not in file]
    if len(local) == len(files) and all(path.is_file() and path.stat().st_size == 0 for path in local):
        shown = ", ".join(str(path) for path in local[:3]) + (", ..." if len(local) > 3 else "")
        raise ConfigError(
            f"data.sources: every file is empty ({len(local)}: {shown}); there is nothing to train on. Point "
            "data.sources at files that hold text"
        )


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


def sources_and_tokenizer(config: DataConfig, work_dir: Path, init: str) -> tuple[list[Any], str]:
    """The shards to tokenize and the tokenizer to tokenize them with; for a ``builtin_corpus``, its shards
    and (unless one is given) its tokenizer are written to ``work_dir/corpus`` first.

    Raises:
        ConfigError: the section is incomplete (see `check_data_section`).
    """
    tokenizer = check_data_section(config, init=init)
    if config.builtin_corpus is not None:
        shards = BUILTIN_CORPORA[config.builtin_corpus](work_dir / "corpus", config.max_documents)
        tokenizer = tokenizer or str(
            train_bpe_tokenizer(shards, work_dir / "corpus" / "tokenizer.json", config.tokenizer_vocab_size)
        )
        return [str(s) for s in shards], tokenizer
    assert tokenizer is not None
    return list(config.sources), tokenizer


EXAMPLE_FORMAT_KEYS = {"kind": "format"}
"""`ExampleFormat` fields the ``data:`` section names otherwise (its other fields keep their names there)."""
EXAMPLE_FORMAT_ONLY = ("tokenizer_template", "template_bos_token", "template_eos_token")
"""`ExampleFormat` fields with no ``data:`` key: ``build_cache`` fills them in from the tokenizer folder."""


def example_format_of(config: DataConfig) -> ExampleFormat:
    """The cache's `ExampleFormat` from the ``data:`` section: each of its fields from the key of the same name
    (``kind`` from ``format``)."""
    names = [
        field.name for field in dataclasses.fields(ExampleFormat) if field.name not in EXAMPLE_FORMAT_ONLY
    ]
    return ExampleFormat(**{name: getattr(config, EXAMPLE_FORMAT_KEYS.get(name, name)) for name in names})


def build_options(config: DataConfig, run_dir: Path) -> dict[str, Any]:
    """The ``build_cache`` arguments that the ``data:`` section sets (fields, format, strictness, workers).

    Shards inside the run directory (or inside ``data.cache_dir`` when that is elsewhere: the builtin
    corpus) are recorded by their path inside it, so a moved or copied run directory reuses its cache.
    """
    work_dir = work_dir_of(config, run_dir)
    inside = work_dir.resolve().is_relative_to(run_dir.resolve())
    return {
        "text_field": config.text_field,
        "example_format": example_format_of(config),
        "strict": config.strict,
        "num_workers": config.num_workers,
        "relative_to": str(run_dir if inside else work_dir),
    }
