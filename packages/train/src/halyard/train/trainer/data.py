"""From the ``data:`` section to datasets: corpus, tokenizer, token cache, train and validation splits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halyard.data import ExampleFormat, LMDataset, TokenCache, build_cache
from halyard.shard import barrier
from halyard.train.corpora import BUILTIN_CORPORA, train_bpe_tokenizer, write_python_stdlib_corpus
from halyard.train.run_config import DataConfig


@dataclass
class PreparedData:
    """The datasets of a run and what produced them."""

    train: LMDataset
    validation: LMDataset | None
    tokenizer_path: str
    cache: TokenCache


def _sources_and_tokenizer(config: DataConfig, work_dir: Path) -> tuple[list[Any], str]:
    if config.builtin_corpus is not None:
        if config.sources:
            raise ValueError("data.sources and data.builtin_corpus are exclusive: set one of them")
        if config.builtin_corpus not in BUILTIN_CORPORA:
            raise ValueError(
                f"data.builtin_corpus={config.builtin_corpus!r}: known corpora are {BUILTIN_CORPORA}"
            )
        shards = write_python_stdlib_corpus(work_dir / "corpus", config.max_documents)
        tokenizer = config.tokenizer or str(
            train_bpe_tokenizer(shards, work_dir / "corpus" / "tokenizer.json", config.tokenizer_vocab_size)
        )
        return [str(s) for s in shards], tokenizer
    if not config.sources:
        raise ValueError("data.sources is empty: give paths/URLs of text shards, or data.builtin_corpus")
    if config.tokenizer is None:
        raise ValueError("data.tokenizer is not set: give a tokenizer.json file or a tokenizer folder")
    return list(config.sources), config.tokenizer


def tokenizer_path_of(config: DataConfig, run_dir: Path) -> str:
    """Where the run's tokenizer is: ``data.tokenizer``, or the one trained for a ``builtin_corpus``."""
    work_dir = Path(config.cache_dir) if config.cache_dir else run_dir / "cache"
    return config.tokenizer or str(work_dir / "corpus" / "tokenizer.json")


def example_format_of(config: DataConfig) -> ExampleFormat:
    """The cache's `ExampleFormat` from the ``data:`` section (``format`` and the chat/prompt fields)."""
    return ExampleFormat(
        kind=config.format,
        messages_field=config.messages_field,
        role_field=config.role_field,
        content_field=config.content_field,
        prompt_field=config.prompt_field,
        completion_field=config.completion_field,
        chat_template=config.chat_template,
        system_marker=config.system_marker,
        user_marker=config.user_marker,
        assistant_marker=config.assistant_marker,
        end_of_turn=config.end_of_turn,
    )


def prepare_data(
    config: DataConfig, run_dir: Path, *, is_main: bool = True, progress: bool = True
) -> PreparedData:
    """Build (or reuse) the token cache and open the train and validation splits.

    Process 0 writes the corpus, tokenizer and cache; the others wait at a barrier and then read. A cache
    built with another tokenizer or BOS/EOS policy is refused by the builder, naming the difference. With
    ``data.format`` chat or prompt_completion the cache stores a loss mask and every batch carries
    ``loss_mask[B, S+1]`` (1 on the assistant/completion tokens), which the loss weights tokens by.

    Args:
        config: the ``data:`` section.
        run_dir: the run directory (the cache goes to ``<run_dir>/cache`` unless ``data.cache_dir`` is set).
        is_main: whether this process builds.
        progress: show the builder's progress bar.
    """
    work_dir = Path(config.cache_dir) if config.cache_dir else run_dir / "cache"
    cache_path = str(work_dir / "tokens")
    tokenizer_path = ""
    if is_main:
        sources, tokenizer_path = _sources_and_tokenizer(config, work_dir)
        build_cache(
            sources,
            tokenizer_path,
            cache_path,
            text_field=config.text_field,
            example_format=example_format_of(config),
            strict=config.strict,
            num_workers=config.num_workers,
            progress=progress,
        )
    barrier("halyard-data-ready")
    if not tokenizer_path:
        tokenizer_path = tokenizer_path_of(config, run_dir)
    cache = TokenCache.open(cache_path)
    split = "train" if config.validation_fraction > 0 else "all"
    common: dict[str, Any] = {
        "seed": config.seed,
        "shuffle": config.shuffle,
        "validation_fraction": config.validation_fraction,
    }
    train = LMDataset(cache, config.seq_len, split=split, **common)
    validation = LMDataset(cache, config.seq_len, split="validation", **common) if split == "train" else None
    return PreparedData(train, validation, tokenizer_path, cache)
