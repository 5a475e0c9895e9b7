"""Columnar shards: parquet files and Arrow files (as written by Hugging Face ``datasets.save_to_disk``)."""

from __future__ import annotations

from collections.abc import Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from halyard.data.sources.records import EMPTY_DOCUMENT, INVALID_UTF8, MissingFieldError, Record, decode_utf8

_BATCH_ROWS = 1024


def read_parquet(url: str, start_row: int, *, text_field: str, strict: bool) -> Iterator[Record]:
    """Yield the documents of one column of a parquet file from row ``start_row`` on.

    Row groups before ``start_row`` are not read.

    Args:
        url: the parquet file.
        start_row: 0-based index of the first row to yield.
        text_field: the column holding the text (string or binary).
        strict: fail on invalid UTF-8 in a binary column instead of replacing and counting.

    Raises:
        MissingFieldError: the column does not exist (names the columns found).
    """
    with fsspec.open(url, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        names = parquet.schema_arrow.names
        if text_field not in names:
            raise MissingFieldError(
                f"{url}: column {text_field!r} not found; columns found: {names}. Pass text_field=<column>.",
                "text_field",
            )
        first_row = 0
        for group in range(parquet.num_row_groups):
            group_rows = parquet.metadata.row_group(group).num_rows
            if first_row + group_rows <= start_row:
                first_row += group_rows
                continue
            for batch in parquet.iter_batches(
                batch_size=_BATCH_ROWS, row_groups=[group], columns=[text_field]
            ):
                yield from _column_records(batch.column(0), first_row, start_row, url, strict)
                first_row += batch.num_rows


def read_arrow(url: str, start_row: int, *, text_field: str, strict: bool) -> Iterator[Record]:
    """Yield the documents of one column of an Arrow IPC file (stream or file format).

    Args:
        url: the ``.arrow`` file (one file of a ``datasets.save_to_disk`` folder).
        start_row: 0-based index of the first row to yield.
        text_field: the column holding the text.
        strict: fail on invalid UTF-8 in a binary column instead of replacing and counting.

    Raises:
        MissingFieldError: the column does not exist (names the columns found).
    """
    with fsspec.open(url, "rb") as handle:
        try:
            reader: pa.ipc.RecordBatchStreamReader | pa.ipc.RecordBatchFileReader = pa.ipc.open_stream(handle)
            batches: Iterator[pa.RecordBatch] = iter(reader)
        except pa.ArrowInvalid:
            handle.seek(0)
            file_reader = pa.ipc.open_file(handle)
            reader = file_reader
            batches = (file_reader.get_batch(index) for index in range(file_reader.num_record_batches))
        names = reader.schema.names
        if text_field not in names:
            raise MissingFieldError(
                f"{url}: column {text_field!r} not found; columns found: {names}. Pass text_field=<column>.",
                "text_field",
            )
        column_index = names.index(text_field)
        first_row = 0
        for batch in batches:
            if first_row + batch.num_rows > start_row:
                yield from _column_records(batch.column(column_index), first_row, start_row, url, strict)
            first_row += batch.num_rows


def _column_records(
    column: pa.Array, first_row: int, start_row: int, url: str, strict: bool
) -> Iterator[Record]:
    skip = max(0, start_row - first_row)
    for offset, value in enumerate(column.to_pylist()[skip:], start=skip):
        row = first_row + offset
        replaced = False
        if isinstance(value, bytes):
            value, replaced = decode_utf8(value, f"{url}:row {row}", strict)
        if value is None or not value.strip():
            yield Record(row, None, EMPTY_DOCUMENT)
        else:
            yield Record(row, value, INVALID_UTF8 if replaced else None)
