"""Building and reading a cache: round trip, local pool == in-process, bad records, reuse and resume."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from data_helpers import (
    cut_back_to_partial,
    folder_bytes,
    make_documents,
    train_tokenizer,
    write_jsonl,
    write_jsonl_shards,
)
from tokenizers import Tokenizer

from halyard.data.builders import CacheMismatchError, build_cache
from halyard.data.cache import TokenCache
from halyard.data.sources import BadRecordError, MissingFieldError

EOS = "<|endoftext|>"


def stream_text(tokenizer: Tokenizer, cache: TokenCache, start: int = 0, stop: int | None = None) -> str:
    stop = cache.num_tokens if stop is None else stop
    return tokenizer.decode(cache.read(start, stop).tolist(), skip_special_tokens=False)


def test_round_trip_and_process_pool_writes_the_same_bytes(tmp_path: Path, tokenizer, tokenizer_path):
    documents = make_documents(600, seed=10)
    shards = write_jsonl_shards(tmp_path / "src", documents, num_shards=3)
    serial = build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "serial"),
        num_workers=0,
        chunk_tokens=500,
        progress=False,
    )
    build_cache(
        str(tmp_path / "src" / "part-{00..02}.jsonl"),
        tokenizer_path,
        str(tmp_path / "pool"),
        num_workers=2,
        chunk_tokens=500,
        progress=False,
    )
    assert folder_bytes(tmp_path / "serial") == folder_bytes(tmp_path / "pool")
    ordered = [document for shard in shards for document in shard]
    assert stream_text(tokenizer, serial) == "".join(document + EOS for document in ordered)
    assert serial.is_finished and serial.num_documents == len(documents)
    assert serial.totals["documents"] == 600 and serial.totals["shards"] == 3
    for index in [0, 1, 299, 599]:
        assert (
            tokenizer.decode(serial.document(index).tolist(), skip_special_tokens=False)
            == ordered[index] + EOS
        )
    ends = serial.document_ends(0, serial.num_tokens)
    assert len(ends) == 600 and ends[-1] == serial.num_tokens
    assert np.all(serial.read(0, serial.num_tokens)[ends - 1] == tokenizer.token_to_id(EOS))


def test_bad_records_are_counted_in_the_ledger_and_strict_fails(tmp_path: Path, tokenizer_path):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(
        b'{"text": "good"}\n{"text": oops\n{"text": ""}\n{"text": "bad \xff byte"}\n{"text": "end"}\n'
    )
    cache = build_cache(str(source), tokenizer_path, str(tmp_path / "c"), num_workers=0, progress=False)
    assert cache.totals["counters"] == {
        "bad_example": 0,
        "empty_document": 1,
        "invalid_utf8": 1,
        "malformed_json": 1,
    }
    assert cache.num_documents == 3 and cache.totals["rows"] == 5
    with pytest.raises(BadRecordError, match=r"bad\.jsonl:2: malformed JSON"):
        build_cache(
            str(source), tokenizer_path, str(tmp_path / "strict"), num_workers=0, strict=True, progress=False
        )


def test_missing_field_from_a_worker_process_names_the_field(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "x.jsonl", ["a b"], field="body")
    with pytest.raises(MissingFieldError, match=r"'text' not found; keys found: \['body', 'id'\]"):
        build_cache(
            str(tmp_path / "x.jsonl"), tokenizer_path, str(tmp_path / "c"), num_workers=1, progress=False
        )


def test_cache_with_other_tokenizer_or_policy_is_refused_unless_rebuilt(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "src.jsonl", make_documents(20, seed=11))
    out = str(tmp_path / "c")
    build_cache(str(tmp_path / "src.jsonl"), tokenizer_path, out, num_workers=0, progress=False)
    with pytest.raises(CacheMismatchError, match=r"processor\.bos_id: None -> 1"):
        build_cache(
            str(tmp_path / "src.jsonl"), tokenizer_path, out, bos="<s>", num_workers=0, progress=False
        )
    other = train_tokenizer(vocab_size=290)
    with pytest.raises(CacheMismatchError, match=r"processor\.tokenizer_sha256: '[0-9a-f]+' -> '[0-9a-f]+'"):
        build_cache(str(tmp_path / "src.jsonl"), other, out, num_workers=0, progress=False)
    rebuilt = build_cache(
        str(tmp_path / "src.jsonl"), other, out, num_workers=0, rebuild=True, progress=False
    )
    assert rebuilt.processor_metadata["vocab_size"] == 290
    again = build_cache(str(tmp_path / "src.jsonl"), other, out, num_workers=0, progress=False)
    assert again.fingerprint == rebuilt.fingerprint


def test_half_written_cache_is_not_complete_and_resumes_inside_a_shard(tmp_path: Path, tokenizer_path):
    write_jsonl_shards(tmp_path / "src", make_documents(400, seed=12), num_shards=2)
    reference = tmp_path / "reference"
    build_cache(
        str(tmp_path / "src"), tokenizer_path, str(reference), num_workers=0, chunk_tokens=300, progress=False
    )
    partial = tmp_path / "partial"
    build_cache(
        str(tmp_path / "src"), tokenizer_path, str(partial), num_workers=0, chunk_tokens=300, progress=False
    )
    committed = cut_back_to_partial(partial, kept_chunks=3)
    half = TokenCache.open(str(partial))
    assert not half.is_finished
    assert half.num_tokens == committed
    resumed = build_cache(
        str(tmp_path / "src"), tokenizer_path, str(partial), num_workers=0, chunk_tokens=300, progress=False
    )
    assert resumed.is_finished
    assert folder_bytes(partial) == folder_bytes(reference)


def test_streaming_reader_sees_only_stable_prefixes_and_waits_with_a_message(
    tmp_path: Path, tokenizer, tokenizer_path, capsys
):
    documents = make_documents(700, seed=13)
    write_jsonl_shards(tmp_path / "src", documents, num_shards=3)
    handle = build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        chunk_tokens=200,
        progress=False,
        background=True,
    )
    reader = TokenCache.open(str(tmp_path / "c"), wait_message_seconds=0.0)
    snapshots = []
    while not reader.is_finished:
        reader.refresh()
        if reader.num_tokens:
            snapshots.append(reader.read(0, reader.num_tokens).copy())
    final = handle.wait()
    total = final.read(0, final.num_tokens)
    assert len(snapshots) >= 2 and snapshots[0].size < total.size
    for snapshot in snapshots:
        np.testing.assert_array_equal(snapshot, total[: snapshot.size])
    # A fresh reader asking for the end waits (printing) while a second build streams.
    second = build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "c2"),
        num_workers=0,
        chunk_tokens=200,
        progress=False,
        background=True,
    )
    waiting = TokenCache.open(str(tmp_path / "c2"), wait_message_seconds=0.0)
    np.testing.assert_array_equal(waiting.read(total.size - 10, total.size), total[-10:])
    second.wait()
    assert "halyard.data: waiting for" in capsys.readouterr().err


def test_reader_touches_only_the_chunks_it_needs_and_waits_with_timeout(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "src.jsonl", make_documents(300, seed=14))
    cache = build_cache(
        str(tmp_path / "src.jsonl"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        chunk_tokens=400,
        progress=False,
    )
    expected = cache.read(0, cache.num_tokens).copy()
    chunk_files = sorted((tmp_path / "c" / "shards" / "00000").glob("*.tokens"))
    assert len(chunk_files) > 4
    sizes = [path.stat().st_size // 2 for path in chunk_files]
    chunk_files[2].unlink()
    start = sum(sizes[:3]) + 5
    np.testing.assert_array_equal(
        TokenCache.open(str(tmp_path / "c")).read(start, start + 50), expected[start : start + 50]
    )
    with pytest.raises(FileNotFoundError):
        TokenCache.open(str(tmp_path / "c")).read(sum(sizes[:2]), sum(sizes[:2]) + 3)
    with pytest.raises(IndexError, match="outside the finished cache"):
        cache.read(0, cache.num_tokens + 1)
    (tmp_path / "half").mkdir()
    ledger = json.loads((tmp_path / "c" / "ledger.json").read_text())
    (tmp_path / "half" / "ledger.json").write_text(
        json.dumps({"identity": ledger["identity"], "finished": False})
    )
    with pytest.raises(TimeoutError, match="Restart `python -m halyard.data build`"):
        TokenCache.open(str(tmp_path / "half"), timeout=0.2).read(0, 10)
    with pytest.raises(FileNotFoundError, match="no token cache"):
        TokenCache.open(str(tmp_path / "nothing"))


def test_memory_filesystem_cache_and_empty_shard(tmp_path: Path, tokenizer, tokenizer_path):
    documents = make_documents(50, seed=15)
    write_jsonl(tmp_path / "a.jsonl", documents)
    (tmp_path / "b.jsonl").write_text("")
    cache = build_cache(
        [str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")],
        tokenizer_path,
        "memory://caches/one",
        num_workers=0,
        chunk_tokens=100,
        progress=False,
    )
    assert cache.num_documents == 50 and cache.totals["shards"] == 2
    assert stream_text(tokenizer, TokenCache.open("memory://caches/one")) == "".join(
        d + EOS for d in documents
    )


def test_huge_document_goes_through_in_pieces(tmp_path: Path, tokenizer, tokenizer_path):
    huge = " ".join(make_documents(3000, seed=16))  # ~250k characters in one record
    write_jsonl(tmp_path / "h.jsonl", ["small", huge, "after"])
    cache = build_cache(
        str(tmp_path / "h.jsonl"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        split_chars=4096,
        chunk_tokens=1000,
        progress=False,
    )
    assert stream_text(tokenizer, cache) == f"small{EOS}{huge}{EOS}after{EOS}"
    assert cache.document(1).size == len(tokenizer.encode(huge).ids) + 1


def test_background_handle_of_a_finished_cache_and_threads_left(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "s.jsonl", ["one", "two"])
    build_cache(str(tmp_path / "s.jsonl"), tokenizer_path, str(tmp_path / "c"), num_workers=0, progress=False)
    handle = build_cache(
        str(tmp_path / "s.jsonl"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        progress=False,
        background=True,
    )
    assert handle.wait(timeout=120).num_documents == 2  # a hang guard, room for a loaded machine
    assert not any(thread.name.startswith("halyard.data build") for thread in threading.enumerate())


def test_first_chunks_grow_to_the_chunk_size_at_document_boundaries(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "s.jsonl", make_documents(600, seed=17))
    cache = build_cache(
        str(tmp_path / "s.jsonl"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        chunk_tokens=800,
        first_chunk_tokens=100,
        progress=False,
    )
    sizes = [chunk.tokens for chunk in cache.shard_progress()[0].chunks]
    longest_document = max(np.diff(cache.document_ends(0, cache.num_tokens), prepend=0))
    for index, size in enumerate(sizes[:-1]):
        target = min(800, 100 * 2**index)
        assert target <= size < target + longest_document
    assert cache.identity["first_chunk_tokens"] == 100


def test_background_build_failure_is_raised_by_wait(tmp_path: Path, tokenizer_path):
    write_jsonl(tmp_path / "x.jsonl", ["a b"], field="body")
    handle = build_cache(
        str(tmp_path / "x.jsonl"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        progress=False,
        background=True,
    )
    with pytest.raises(MissingFieldError, match="'text' not found"):
        handle.cache.read(0, 10)  # a read waiting for tokens the failed build will never write
    with pytest.raises(MissingFieldError, match="'text' not found"):
        handle.wait(timeout=120)  # a hang guard, room for a loaded machine
    assert not handle.cache.is_finished


def test_progress_bar_shows_documents_tokens_and_throughput(tmp_path: Path, tokenizer_path, capsys):
    write_jsonl_shards(tmp_path / "src", make_documents(40, seed=18), num_shards=2)
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), num_workers=0, progress=True)
    shown = capsys.readouterr().err
    assert "2/2" in shown and "documents=40" in shown and "tokens_per_s=" in shown
