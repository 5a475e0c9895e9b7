"""Hostile corpora: bad records are skipped and counted by file, bad files are named, and a cache built with
another tokenizer is refused without being touched."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import pytest
from data_helpers import folder_bytes, make_documents, train_tokenizer, write_jsonl
from tokenizers import processors

from halyard.data import TokenCache, UnreadableShardError, build_cache
from halyard.data.builders.build import CacheMismatchError

HUGE_LINE_BYTES = 100 * 1024 * 1024
RANDOM_LINES = b"".join(b'{"text": "%s"}\n' % os.urandom(100).hex().encode() for _ in range(500))


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer().save(str(path))
    return str(path)


def test_a_hostile_corpus_builds_with_every_bad_record_counted(
    tmp_path: Path, tokenizer_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a_good.jsonl", make_documents(50, seed=1))
    (src / "b_malformed.jsonl").write_text(
        '{"text": "ok one"}\n{"text": broken\n[1, 2]\n{"text": "ok two"}\n'
    )
    (src / "c_binary_garbage.jsonl").write_bytes(os.urandom(20_000))
    (src / "d_empty.jsonl").write_bytes(b"")
    (src / "e_invalid_utf8.jsonl").write_bytes(b'{"text": "caf\xc3\xa9 \xff\xfe bad"}\n')
    with open(src / "f_huge_line.jsonl", "w") as handle:  # one unterminated 100 MB line
        handle.write('{"text": "' + "abc " * (HUGE_LINE_BYTES // 4) + "\n")
    with caplog.at_level(logging.WARNING):
        cache = build_cache(str(src), tokenizer_path, str(tmp_path / "cache"), num_workers=0, progress=False)
    assert cache.is_finished and cache.num_documents == 50 + 2 + 1
    ledger = json.loads((tmp_path / "cache" / "ledger.json").read_text())
    counters = {Path(s["source"]["url"]).name: s["counters"] for s in ledger["shard_progress"]}
    assert counters["b_malformed.jsonl"]["malformed_json"] == 2
    assert counters["c_binary_garbage.jsonl"]["malformed_json"] > 0
    assert counters["e_invalid_utf8.jsonl"]["invalid_utf8"] == 1
    assert counters["f_huge_line.jsonl"]["malformed_json"] == 1
    assert sum(counters["d_empty.jsonl"].values()) == 0
    text = caplog.text
    for where in (
        "b_malformed.jsonl:2",
        "b_malformed.jsonl:3",
        "e_invalid_utf8.jsonl:1",
        "f_huge_line.jsonl:1",
    ):
        assert where in text, f"{where} not reported"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("plain_text.jsonl.gz", b'{"text": "not gzip at all"}\n'),  # a .gz suffix on plain text
        ("not_zstd.jsonl.zst", b'{"text": "not zstd"}\n'),
        ("corrupt.parquet", b"this is not a parquet file"),
        ("truncated.jsonl.gz", gzip.compress(RANDOM_LINES)[: len(RANDOM_LINES) // 4]),
    ],
    ids=["gz-on-plain-text", "zst-on-plain-text", "corrupt-parquet", "truncated-gz"],
)
def test_a_file_that_is_not_what_its_suffix_says_is_named(
    tmp_path: Path, tokenizer_path: str, name: str, content: bytes
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_bytes(content)
    with pytest.raises(UnreadableShardError, match=name):
        build_cache(
            str(tmp_path / "src"), tokenizer_path, str(tmp_path / "cache"), num_workers=0, progress=False
        )
    assert (
        not (tmp_path / "cache" / "ledger.json").exists()
        or not TokenCache.open(str(tmp_path / "cache")).is_finished
    )


def test_a_cache_built_with_another_tokenizer_is_refused_and_left_alone(
    tmp_path: Path, tokenizer_path: str
) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", make_documents(40, seed=2))
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "cache"), num_workers=0, progress=False)
    before = folder_bytes(tmp_path / "cache")
    other = train_tokenizer(processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)]), 300)
    other_path = tmp_path / "other.json"
    other.save(str(other_path))
    with pytest.raises(CacheMismatchError, match="tokenizer"):
        build_cache(
            str(tmp_path / "src"), str(other_path), str(tmp_path / "cache"), num_workers=0, progress=False
        )
    assert folder_bytes(tmp_path / "cache") == before
