"""Whole rows of a shard as objects (for records that are more than a text: a prompt and its answer).

`read_rows` yields every row of a jsonl, json, parquet or arrow shard as a dict, with the place it came from
(``file:line`` or ``file[row]``), so that a consumer can name the record of any problem it finds. A line that
is not a JSON object is an error naming its line; nothing is skipped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from halyard.data.sources.opening import open_binary
from halyard.data.sources.records import BadRecordError
from halyard.data.sources.shards import ShardSpec


class Row(NamedTuple):
    """One row: its object and where it is (``file:line`` for jsonl, ``file[index]`` otherwise)."""

    value: dict[str, Any]
    where: str


def read_rows(shard: ShardSpec) -> Iterator[Row]:
    """Yield every row of ``shard`` as a dict.

    Raises:
        BadRecordError: a line or element that is not a JSON object, or a text shard (no fields); names
            file:line and the fix.
    """
    if shard.format == "jsonl":
        with open_binary(shard.url) as handle:
            for index, raw in enumerate(handle):
                if raw.strip():
                    yield Row(_object(raw, f"{shard.url}:{index + 1}"), f"{shard.url}:{index + 1}")
    elif shard.format == "json":
        with open_binary(shard.url) as handle:
            value = _parsed(handle.read(), f"{shard.url}:1")
        if not isinstance(value, list):
            raise BadRecordError(
                f"{shard.url}: a .json source must hold an array of objects; use .jsonl for one a line"
            )
        for index, item in enumerate(value):
            yield Row(_checked(item, f"{shard.url}[{index}]"), f"{shard.url}[{index}]")
    elif shard.format in ("parquet", "arrow"):
        yield from _columnar_rows(shard)
    else:
        raise BadRecordError(
            f"{shard.url}: a {shard.format} shard holds text, not records with fields; give jsonl, json, parquet "
            "or arrow files"
        )


def _columnar_rows(shard: ShardSpec) -> Iterator[Row]:
    with fsspec.open(shard.url, "rb") as handle:
        if shard.format == "parquet":
            table = pq.read_table(handle)
        else:
            try:  # datasets.save_to_disk writes the stream format; other tools the file format
                table = pa.ipc.open_stream(handle).read_all()
            except pa.ArrowInvalid:
                handle.seek(0)
                table = pa.ipc.open_file(handle).read_all()
    for index, value in enumerate(table.to_pylist()):
        yield Row(value, f"{shard.url}[{index}]")


def _parsed(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRecordError(f"{where}: not UTF-8; re-encode the file as UTF-8") from None
    except json.JSONDecodeError as error:
        raise BadRecordError(
            f"{where}: malformed JSON ({error.msg} at column {error.colno}); fix the line"
        ) from None


def _object(raw: bytes, where: str) -> dict[str, Any]:
    return _checked(_parsed(raw, where), where)


def _checked(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRecordError(
            f"{where}: expected a JSON object with named fields, found {type(value).__name__}"
        )
    return value
