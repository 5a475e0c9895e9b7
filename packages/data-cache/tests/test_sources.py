"""Sources: URL expansion, every format and compression, opening at row N, and bad input."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from data_helpers import make_documents, write_jsonl

from halyard.data.sources import (
    EMPTY_DOCUMENT,
    INVALID_UTF8,
    MALFORMED_JSON,
    BadRecordError,
    MissingFieldError,
    ShardSpec,
    SourceSpec,
    expand_braces,
    expand_urls,
    infer_format,
    read_shard,
    resolve_shards,
)


def texts(records) -> list[str]:
    return [record.text for record in records if record.text is not None]


def test_brace_expansion_lists_and_zero_padded_ranges():
    assert expand_braces("a{1,2}b{x,y}") == ["a1bx", "a1by", "a2bx", "a2by"]
    assert expand_braces("part-{008..011}.jsonl") == [f"part-{n:03d}.jsonl" for n in range(8, 12)]
    assert expand_braces("plain") == ["plain"]


def test_expand_urls_globs_folders_braces_in_order(tmp_path: Path):
    for name in ["b.jsonl", "a.jsonl", "c.txt", ".hidden"]:
        (tmp_path / name).write_text("x")
    assert expand_urls(str(tmp_path / "*.jsonl")) == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert expand_urls(str(tmp_path)) == [str(tmp_path / n) for n in ["a.jsonl", "b.jsonl", "c.txt"]]
    assert expand_urls(str(tmp_path / "{c.txt,a.jsonl}")) == [
        str(tmp_path / "c.txt"),
        str(tmp_path / "a.jsonl"),
    ]


def test_missing_file_error_names_the_url(tmp_path: Path):
    missing = str(tmp_path / "nope-*.jsonl")
    with pytest.raises(FileNotFoundError, match="nope-"):
        expand_urls(missing)
    with pytest.raises(FileNotFoundError, match="gone.jsonl"):
        list(read_shard(ShardSpec(str(tmp_path / "gone.jsonl"), "jsonl", "text", "document")))


def test_infer_format_ignores_compression_and_rejects_unknown():
    assert infer_format("s3://b/x.jsonl.zst") == "jsonl"
    assert infer_format("x.txt.gz") == "text"
    assert infer_format("x.parquet") == "parquet"
    with pytest.raises(ValueError, match=r"x\.csv.*format="):
        infer_format("x.csv")


@pytest.mark.parametrize("compression", ["", ".gz", ".zst", ".bz2"])
def test_jsonl_with_compression_reads_all_rows_and_opens_at_row_n(tmp_path: Path, compression: str):
    documents = make_documents(20, seed=1)
    raw = "".join(json.dumps({"text": d}) + "\n" for d in documents).encode()
    compress = {"": lambda b: b, ".gz": gzip.compress, ".zst": zstandard.compress, ".bz2": bz2.compress}
    path = tmp_path / f"data.jsonl{compression}"
    path.write_bytes(compress[compression](raw))
    shard = resolve_shards(str(path))[0]
    assert shard.format == "jsonl"
    assert texts(read_shard(shard)) == documents
    records = list(read_shard(shard, start_row=7))
    assert [r.row for r in records] == list(range(7, 20))
    assert texts(records) == documents[7:]


def test_text_files_document_and_line_modes(tmp_path: Path):
    (tmp_path / "a.txt").write_text("line one\n\nline two\n")
    whole = SourceSpec(str(tmp_path / "a.txt"))
    lines = SourceSpec(str(tmp_path / "a.txt"), text_mode="line")
    assert texts(read_shard(resolve_shards(whole)[0])) == ["line one\n\nline two\n"]
    records = list(read_shard(resolve_shards(lines)[0]))
    assert texts(records) == ["line one", "line two"]
    assert records[1].issue == EMPTY_DOCUMENT
    assert texts(read_shard(resolve_shards(lines)[0], start_row=2)) == ["line two"]
    assert list(read_shard(resolve_shards(whole)[0], start_row=1)) == []


def test_json_array_and_parquet_column_choice(tmp_path: Path):
    documents = make_documents(30, seed=2)
    (tmp_path / "a.json").write_text(json.dumps([{"body": d} for d in documents]))
    table = pa.table({"body": documents, "n": list(range(30))})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=7)
    for name in ["a.json", "b.parquet"]:
        shard = resolve_shards(SourceSpec(str(tmp_path / name), text_field="body"))[0]
        assert texts(read_shard(shard)) == documents
        assert texts(read_shard(shard, start_row=16)) == documents[16:]
    with pytest.raises(MissingFieldError, match=r"'text' not found.*\['body', 'n'\]"):
        list(read_shard(resolve_shards(str(tmp_path / "b.parquet"))[0]))


def test_hf_dataset_saved_to_disk(tmp_path: Path):
    import datasets  # the package's [test] extra installs it

    documents = make_documents(50, seed=3)
    datasets.Dataset.from_dict({"text": documents}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    shards = resolve_shards(str(tmp_path / "hf"))
    assert len(shards) == 2 and all(shard.format == "arrow" for shard in shards)
    assert [t for shard in shards for t in texts(read_shard(shard))] == documents
    first_len = len(list(read_shard(shards[0])))
    assert texts(read_shard(shards[0], start_row=first_len - 3)) == documents[first_len - 3 : first_len]


def test_memory_filesystem_urls_with_glob():
    documents = make_documents(10, seed=4)
    fs = fsspec.filesystem("memory")
    for index in range(2):
        with fs.open(f"/srcs/p{index}.jsonl", "w") as handle:
            handle.write("".join(json.dumps({"text": d}) + "\n" for d in documents[index::2]))
    shards = resolve_shards("memory://srcs/p*.jsonl")
    assert [s.url.replace(":///", "://") for s in shards] == [
        "memory://srcs/p0.jsonl",
        "memory://srcs/p1.jsonl",
    ]
    assert texts(read_shard(shards[1])) == documents[1::2]


def test_malformed_json_is_skipped_counted_and_logged_or_fails_under_strict(tmp_path: Path, caplog):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "good one"}\n{"text": broken\n{"text": "good two"}\n[1, 2]\n')
    shard = resolve_shards(str(path))[0]
    with caplog.at_level(logging.WARNING, logger="halyard.data"):
        records = list(read_shard(shard))
    assert texts(records) == ["good one", "good two"]
    assert [r.issue for r in records] == [None, MALFORMED_JSON, None, MALFORMED_JSON]
    assert f"{path}:2" in caplog.text
    with pytest.raises(BadRecordError, match=rf"{path}:2: malformed JSON"):
        list(read_shard(shard, strict=True))


def test_missing_text_field_names_field_and_keys(tmp_path: Path):
    path = write_jsonl(tmp_path / "x.jsonl", ["a", "b"], field="content")
    with pytest.raises(
        MissingFieldError, match=r"x\.jsonl:1: text field 'text' not found; keys found: \['content', 'id'\]"
    ):
        list(read_shard(resolve_shards(str(path))[0]))


def test_invalid_utf8_is_replaced_and_counted(tmp_path: Path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"text": "ok \xff here"}\n{"text": "fine"}\n')
    records = list(read_shard(resolve_shards(str(path))[0]))
    assert records[0].text == "ok \ufffd here" and records[0].issue == INVALID_UTF8
    assert records[1].issue is None
    with pytest.raises(BadRecordError, match="u.jsonl:1: invalid UTF-8"):
        list(read_shard(resolve_shards(str(path))[0], strict=True))


def test_empty_documents_and_empty_shard(tmp_path: Path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"text": ""}\n{"text": "   "}\n\n{"text": null}\n{"text": "x"}\n')
    records = list(read_shard(resolve_shards(str(path))[0]))
    assert [r.issue for r in records] == [EMPTY_DOCUMENT] * 4 + [None]
    (tmp_path / "empty.jsonl").write_text("")
    assert list(read_shard(resolve_shards(str(tmp_path / "empty.jsonl"))[0])) == []
