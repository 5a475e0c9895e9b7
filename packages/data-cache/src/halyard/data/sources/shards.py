"""Sources as ordered lists of shards, and reading one shard from row N."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec

from halyard.data.errors import DataInputError, SourceFormatError, SourceNotFoundError
from halyard.data.sources.columnar import read_arrow, read_parquet
from halyard.data.sources.jsonl import read_json, read_jsonl
from halyard.data.sources.records import Record, UnreadableShardError
from halyard.data.sources.text import read_text
from halyard.data.sources.urls import expand_urls, is_hf_dataset_folder

if TYPE_CHECKING:
    from halyard.data.examples.formats import ExampleFormat

FORMATS = ("text", "jsonl", "json", "parquet", "arrow")
# File formats that can hold chat and prompt/completion examples (nested JSON objects).
_EXAMPLE_FORMATS = ("jsonl", "json")
_COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd", ".bz2", ".xz")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
}


@dataclass(frozen=True)
class SourceSpec:
    """Where documents come from and how to read them.

    Attributes:
        urls: patterns (paths or fsspec URLs with braces/globs, folders, ``save_to_disk`` folders),
            expanded in the order given.
        format: ``"auto"`` (from the suffix, compression suffixes ignored) or one of ``FORMATS``.
        text_field: the JSON key or column holding the text (jsonl, json, parquet, arrow).
        text_mode: for text files, ``"document"`` (one document per file) or ``"line"`` (one per line).
        example: chat or prompt/completion examples (jsonl/json only) instead of ``text_field`` documents;
            None reads documents.
    """

    urls: tuple[str, ...]
    format: str = "auto"
    text_field: str = "text"
    text_mode: str = "document"
    example: ExampleFormat | None = None

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            object.__setattr__(self, "urls", (self.urls,))
        else:
            object.__setattr__(self, "urls", tuple(self.urls))
        if self.format != "auto" and self.format not in FORMATS:
            raise ValueError(f"source format {self.format!r} is not known; use 'auto' or one of {FORMATS}")
        if self.text_mode not in ("document", "line"):
            raise ValueError(f"text_mode {self.text_mode!r} is not known; use 'document' or 'line'")


@dataclass(frozen=True)
class ShardSpec:
    """One file of a source, with everything a worker needs to read it (picklable, no open handles)."""

    url: str
    format: str
    text_field: str
    text_mode: str
    example: ExampleFormat | None = None

    @property
    def has_targets(self) -> bool:
        """True when the shard holds chat or prompt/completion examples (a loss mask is stored)."""
        return self.example is not None and self.example.has_targets

    def describe(self, relative_to: str | None = None) -> dict[str, Any]:
        """The fields stored in the ledger for this shard (the example format only when it is not text).

        A local file outside ``relative_to`` also gets ``content`` (its size and a hash of its first
        64 KiB): the cache knows it by those, so the file may move to another path, disk or machine.

        Args:
            relative_to: a local folder; a shard under it is recorded as ``<root>/its/path/inside``, so
                the folder (a run directory holding the corpus and the cache) can be moved.
        """
        url = _relative_url(self.url, relative_to)
        described: dict[str, Any] = {
            "url": url,
            "format": self.format,
            "text_field": self.text_field,
            "mode": self.text_mode,
        }
        if self.example is not None and self.example.has_targets:
            described["example"] = self.example.describe()
        if not url.startswith("<root>/") and "://" not in url.removeprefix("file://"):
            described["content"] = local_file_content(url.removeprefix("file://"))
        return described


CONTENT_PREFIX_BYTES = 64 * 1024


def local_file_content(path: str) -> dict[str, Any]:
    """What identifies a local source file wherever it lies: its size and the hash of its first 64 KiB."""
    with open(path, "rb") as file:
        head = file.read(CONTENT_PREFIX_BYTES)
    return {"bytes": os.path.getsize(path), "prefix_sha256": hashlib.sha256(head).hexdigest()[:32]}


def _relative_url(url: str, root: str | None) -> str:
    if root is None or "://" in url.removeprefix("file://"):
        return url
    path, folder = os.path.abspath(url.removeprefix("file://")), os.path.abspath(root)
    return "<root>/" + os.path.relpath(path, folder) if path.startswith(folder + os.sep) else url


def infer_format(url: str) -> str:
    """The format of ``url`` from its suffix (after dropping a compression suffix).

    Raises:
        ValueError: an unknown suffix; the message names the URL and how to choose a format.
    """
    name = url.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    for suffix, format_name in _SUFFIX_FORMATS.items():
        if name.endswith(suffix):
            return format_name
    raise SourceFormatError(
        f"cannot tell the format of {url!r} from its suffix; pass format= one of {FORMATS} "
        "in the SourceSpec (or --format on the command line)"
    )


def resolve_shards(sources: SourceSpec | str | Sequence[SourceSpec | str]) -> list[ShardSpec]:
    """Expand sources into the ordered list of shards of a cache.

    Args:
        sources: a ``SourceSpec``, a pattern string (format from the suffix), or a list of either; shards
            are ordered source by source, then by the order of the expanded URLs.

    Raises:
        FileNotFoundError: a pattern matches nothing (names it).
        ValueError: a format cannot be inferred, or there are no shards at all.
    """
    if isinstance(sources, SourceSpec | str):
        sources = [sources]
    shards: list[ShardSpec] = []
    for source in sources:
        spec = SourceSpec(urls=(source,)) if isinstance(source, str) else source
        for url in expand_urls(list(spec.urls)):
            if is_hf_dataset_folder(url):
                shards.extend(
                    ShardSpec(file_url, "arrow", spec.text_field, spec.text_mode, spec.example)
                    for file_url in _hf_arrow_files(url)
                )
                continue
            format_name = infer_format(url) if spec.format == "auto" else spec.format
            shards.append(ShardSpec(url, format_name, spec.text_field, spec.text_mode, spec.example))
    for shard in shards:
        if shard.has_targets and shard.format not in _EXAMPLE_FORMATS:
            assert shard.example is not None
            raise SourceFormatError(
                f"{shard.url}: {shard.example.kind} examples are read from jsonl or json files, not "
                f"{shard.format}; convert the shard to JSON lines (one example object per line)"
            )
    if not shards:
        raise SourceNotFoundError("the sources expand to no shard at all; check the patterns")
    return shards


def _hf_arrow_files(folder: str) -> list[str]:
    with fsspec.open(folder.rstrip("/") + "/state.json", "r") as handle:
        state = json.load(handle)
    files = [entry["filename"] for entry in state.get("_data_files", [])]
    if not files:
        raise SourceFormatError(
            f"{folder}/state.json lists no data files; is this a datasets.save_to_disk folder?"
        )
    return [folder.rstrip("/") + "/" + name for name in files]


def read_shard(shard: ShardSpec, start_row: int = 0, *, strict: bool = False) -> Iterator[Record]:
    """Yield the records of ``shard`` from row ``start_row`` on (rows before it are skipped, not parsed).

    Args:
        shard: the shard to read.
        start_row: 0-based row to start from (resume point).
        strict: fail on malformed records, invalid examples and invalid UTF-8 instead of
            skipping/replacing and counting.

    Raises:
        FileNotFoundError: the shard's file is missing (names the URL).
        BadRecordError, MissingFieldError: see the readers of each format.
        UnreadableShardError: the file cannot be decoded as its suffix says (names the URL).
    """
    fs, path = fsspec.core.url_to_fs(shard.url)
    if not fs.exists(path):
        raise SourceNotFoundError(f"shard {shard.url!r} does not exist (was it moved or deleted?)")
    if shard.format == "text":
        records = read_text(shard.url, start_row, mode=shard.text_mode, strict=strict)
    elif shard.format in _EXAMPLE_FORMATS:
        read = read_jsonl if shard.format == "jsonl" else read_json
        records = read(
            shard.url, start_row, text_field=shard.text_field, strict=strict, example=shard.example
        )
    else:
        readers = {"parquet": read_parquet, "arrow": read_arrow}
        records = readers[shard.format](shard.url, start_row, text_field=shard.text_field, strict=strict)
    return _naming_the_shard(records, shard)


def _naming_the_shard(records: Iterator[Record], shard: ShardSpec) -> Iterator[Record]:
    # Decompressors and parquet readers raise errors that do not say which file they were reading.
    try:
        yield from records
    except (DataInputError, FileNotFoundError):
        raise
    except Exception as error:
        raise UnreadableShardError(
            f"shard {shard.url!r} could not be read as {shard.format} (compression inferred from the suffix): "
            f"{type(error).__name__}: {error}. Check that the file's suffix matches its content, or give "
            "the format explicitly."
        ) from error
