"""The ``data.mixture`` section: named sources, their weights and a step schedule of weights, checked.

Each source is a ``data:`` section of its own (the keys it sets over those of ``data:``); the keys in
`SHARED_KEYS` hold for every source (one tokenizer, one sequence length, one builder). The weights follow
`halyard.data.MixtureDataset`: per block of rows, each source gets its rounded share; a source a stage
leaves out gets 0.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import draccus
from draccus.utils import DecodingError, ParsingError

from halyard.train.config.errors import did_you_mean

SHARED_KEYS = (
    "tokenizer",
    "tokenizer_vocab_size",
    "seq_len",
    "builder",
    "ray_address",
    "num_workers",
    "mixture",
    "allow_mixture_change",
)
"""``data:`` keys set once for every source of a mixture."""

ROWS_PER_BLOCK = 256
"""The block size a mixture aims for when ``data.mixture.block_size`` is null."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class MixtureConfig:
    """Several named sources trained on together in set proportions (no sources: data.sources is the one source)."""

    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The sources by name (letters, digits, _ and -), each with its own data: keys (sources or builtin_corpus, text_field, format and its fields, shuffle, seed, validation_fraction, strict, cache_dir, max_documents); a key a source leaves out comes from data:, and tokenizer, seq_len, builder, ray_address and num_workers are shared. Each source has its own token cache (default <data.cache_dir or run_dir/cache>/<name>) and its own validation split."""
    weights: dict[str, float] = field(default_factory=dict)
    """Each source's share of the rows from step 0, e.g. {web: 0.7, code: 0.3} (normalised to sum 1; a source left out gets 0)."""
    schedule: dict[int, dict[str, float]] = field(default_factory=dict)
    """New weights from a step on, steps increasing, e.g. {1000: {web: 0.5, code: 0.5}}; an entry at step 0 stands for weights."""
    block_size: int | None = None
    """Rows per block: every block holds exactly each source's rounded share. null: about 256 rows, a whole number of steps that divides every schedule step; a size of your own must put every schedule step at the start of a block."""


def mixture_sources(data: Any) -> dict[str, Any]:
    """Each source of ``data.mixture`` as a complete ``data:`` section (a `DataConfig` without a mixture).

    Args:
        data: the ``data:`` section (a `DataConfig`).

    Raises:
        ValueError: a key a source cannot set, or a value its field refuses, named
            ``data.mixture.sources.<name>.<key>``.
    """
    data_class = type(data)
    names = [f.name for f in dataclasses.fields(data_class)]
    base = draccus.encode(data)
    for key in ("mixture", "allow_mixture_change"):
        base.pop(key)
    sources = {}
    for name, keys in data.mixture.sources.items():
        where = f"data.mixture.sources.{name}"
        if not isinstance(keys, dict):
            raise ValueError(f"{where}: give that source's data: keys as a mapping, e.g. {{sources: [...]}}")
        for key in keys:
            if key in SHARED_KEYS:
                raise ValueError(f"{where}.{key}: set once for every source, as data.{key}")
            if key not in names:
                raise ValueError(
                    f"{where}.{key}: not a data: key.{did_you_mean(key, [n for n in names if n not in SHARED_KEYS])}"
                )
        sources[name] = _decode(data_class, {**base, **keys}, name)
    return sources


def _decode(data_class: type, values: dict[str, Any], name: str) -> Any:
    """One source's `DataConfig`; a refused value raises a `ValueError` naming its key (and no chain of
    causes: the config parser would print those too)."""
    message = ""
    try:
        return draccus.decode(data_class, values)
    except DecodingError as error:
        key = ".".join(str(part) for part in error.key_path)
        message = f"data.mixture.sources.{name}.{key}: {error.message}"
    except (ParsingError, TypeError, ValueError) as error:  # the source's own check (its __post_init__)
        message = in_source_terms(str(error.__cause__ or error.__context__ or error), name)
    raise ValueError(message)


def in_source_terms(message: str, name: str) -> str:
    """``message`` with each per-source key ``data.<key>`` written ``data.mixture.sources.<name>.<key>``."""

    def rename(match: re.Match[str]) -> str:
        key = match.group(1)
        return match.group(0) if key in SHARED_KEYS else f"data.mixture.sources.{name}.{key}"

    return re.sub(r"(?<![\w.])data\.(\w+)", rename, message)


def source_order(mixture: MixtureConfig) -> list[str]:
    """The sources in the order the batches index them (``source``, the per-source losses): by name, so
    reordering them in a config file changes no batch."""
    return sorted(mixture.sources)


def weight_schedule(mixture: MixtureConfig) -> list[tuple[int, dict[str, float]]]:
    """``[(start_step, {source: weight}), ...]`` from step 0 (`halyard.data.MixtureDataset`'s ``weights``)."""
    stages = [(0, dict(mixture.weights))] if mixture.weights else []
    return stages + [(int(step), dict(weights)) for step, weights in mixture.schedule.items()]


def check_mixture(data: Any) -> None:
    """Check ``data.mixture`` and how it sits with the rest of ``data:`` (called by `DataConfig`).

    Raises:
        ValueError: a one-line message naming the key: a mixture beside data.sources or
            data.builtin_corpus, a bad source name or key, weights for unknown sources, a negative weight,
            weights summing to 0, no weights at step 0, schedule steps that do not increase, a bad block size.
    """
    mixture: MixtureConfig = data.mixture
    if not mixture.sources:
        if mixture.weights or mixture.schedule:
            raise ValueError("data.mixture.weights and schedule need data.mixture.sources: name the sources")
        return
    for key in ("sources", "builtin_corpus"):
        if getattr(data, key):
            raise ValueError(
                f"data.mixture and data.{key} are exclusive: give each source its own "
                f"data.mixture.sources.<name>.{key}"
            )
    for name in mixture.sources:
        if not _NAME.match(str(name)):
            raise ValueError(
                f"data.mixture.sources.{name}: a source name is letters, digits, _ and - (it names a cache "
                "folder and metrics)"
            )
    for name, source in mixture_sources(data).items():
        if source.format == "preference":
            raise ValueError(
                f"data.mixture.sources.{name}.format=preference: a mixture trains on windows of tokens; "
                "preference pairs train alone (data.sources)"
            )
    if not mixture.weights and 0 not in mixture.schedule:
        raise ValueError(
            "data.mixture.weights is empty: give each source its share from step 0, e.g. "
            f"{{{', '.join(f'{name}: 1' for name in mixture.sources)}}}"
        )
    if mixture.weights and 0 in mixture.schedule:
        raise ValueError(
            "data.mixture.schedule.0 and data.mixture.weights both give the step-0 weights: keep one"
        )
    _check_weights("data.mixture.weights", mixture.weights, list(mixture.sources))
    previous: int | None = None
    for step, weights in mixture.schedule.items():
        if step < 0:
            raise ValueError(f"data.mixture.schedule.{step}: a step is 0 or more")
        if previous is not None and step <= previous:
            raise ValueError(
                f"data.mixture.schedule: steps must increase, got {step} after {previous}; list them in order"
            )
        previous = step
        _check_weights(f"data.mixture.schedule.{step}", weights, list(mixture.sources))
    if mixture.block_size is not None and mixture.block_size < 1:
        raise ValueError(f"data.mixture.block_size={mixture.block_size}: must be at least 1 (or null)")


def _check_weights(key: str, weights: dict[str, float], names: list[str]) -> None:
    if not weights and key.endswith(".weights"):
        return
    for name, weight in weights.items():
        if name not in names:
            raise ValueError(
                f"{key}.{name}: no such source; the sources are {', '.join(names)}.{did_you_mean(name, names)}"
            )
        if not weight >= 0 or not math.isfinite(weight):
            raise ValueError(f"{key}.{name}={weight}: a weight is a finite number >= 0")
    if sum(weights.values()) <= 0:
        raise ValueError(f"{key}: the weights sum to 0; give at least one source a positive weight")


def block_rows(mixture: MixtureConfig, batch_size: int) -> int:
    """Rows per block of the mixture for ``trainer.batch_size``.

    ``data.mixture.block_size`` when set; else ``k * batch_size`` with ``k`` the largest number of steps up
    to ``ROWS_PER_BLOCK / batch_size`` (at least 1) that divides every schedule step, so every change
    starts a block.

    Raises:
        ValueError: an explicit block size that a schedule step does not start a block at (named).
    """
    steps = [step for step, _ in weight_schedule(mixture) if step > 0]
    if mixture.block_size is not None:
        for step in steps:
            if step * batch_size % mixture.block_size:
                raise ValueError(
                    f"data.mixture.block_size={mixture.block_size}: the change at data.mixture.schedule.{step} "
                    f"falls inside a block (step * trainer.batch_size = {step * batch_size} rows); use a "
                    f"block size dividing {step * batch_size}, or null"
                )
        return mixture.block_size
    common = math.gcd(*steps) if steps else 0
    most = max(1, math.ceil(ROWS_PER_BLOCK / batch_size))
    steps_per_block = max(k for k in range(1, most + 1) if common % k == 0)
    return steps_per_block * batch_size
