"""A folder holding a corpus and its cache can be moved: shards inside ``relative_to`` are recorded by
their path inside it, local files outside it by their content (size, hash of the first 64 KiB), so a moved
cache or moved sources are reused, not refused as built from other sources; a changed source is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from data_helpers import folder_bytes, make_documents, write_jsonl_shards

from halyard.data import CacheMismatchError, TokenCache, build_cache


def test_a_moved_folder_reuses_its_cache_and_records_no_absolute_path(tmp_path: Path, tokenizer_path: str):
    first = tmp_path / "first"
    write_jsonl_shards(first / "corpus", make_documents(60, seed=31), num_shards=2)
    options = {"num_workers": 0, "progress": False}
    build_cache(
        str(first / "corpus"), tokenizer_path, str(first / "cache"), relative_to=str(first), **options
    )
    assert str(first) not in "".join(
        data.decode("latin-1") for data in folder_bytes(first / "cache").values()
    )
    ledger = json.loads((first / "cache" / "ledger.json").read_text())
    assert [shard["url"] for shard in ledger["identity"]["shards"]] == [
        "<root>/corpus/part-00.jsonl",
        "<root>/corpus/part-01.jsonl",
    ]
    before = folder_bytes(first / "cache")
    moved = tmp_path / "elsewhere" / "moved"
    shutil.move(first, moved)
    cache = build_cache(
        str(moved / "corpus"), tokenizer_path, str(moved / "cache"), relative_to=str(moved), **options
    )
    assert isinstance(cache, TokenCache) and cache.is_finished and cache.num_documents == 60
    assert folder_bytes(moved / "cache") == before  # reused as it was: nothing rebuilt or rewritten


def test_sources_moved_elsewhere_are_known_by_their_content(
    tmp_path: Path, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
):
    """Sources outside ``relative_to`` moved to another disk: same bytes, so the cache and its fingerprint
    (the manifests of checkpoints that read it) stay; the ledger then names the new paths."""
    write_jsonl_shards(tmp_path / "disk1" / "corpus", make_documents(60, seed=32), num_shards=2)
    options = {"num_workers": 0, "progress": False, "relative_to": str(tmp_path / "run")}
    out = str(tmp_path / "run" / "cache")
    built = build_cache(str(tmp_path / "disk1" / "corpus"), tokenizer_path, out, **options)
    assert isinstance(built, TokenCache)
    chunks = {
        name: data for name, data in folder_bytes(tmp_path / "run" / "cache").items() if "ledger" not in name
    }
    shutil.move(tmp_path / "disk1", tmp_path / "disk2")
    reused = build_cache(str(tmp_path / "disk2" / "corpus"), tokenizer_path, out, **options)
    assert isinstance(reused, TokenCache) and reused.is_finished and reused.fingerprint == built.fingerprint
    assert "2 source file(s) of" in capsys.readouterr().err
    ledger = json.loads((tmp_path / "run" / "cache" / "ledger.json").read_text())
    assert all("/disk2/corpus/part-" in shard["url"] for shard in ledger["identity"]["shards"])
    after = folder_bytes(tmp_path / "run" / "cache")
    assert {name: data for name, data in after.items() if "ledger" not in name} == chunks  # nothing rebuilt


def test_a_changed_source_is_refused_in_one_line_naming_the_file(tmp_path: Path, tokenizer_path: str):
    write_jsonl_shards(tmp_path / "corpus", make_documents(40, seed=33), num_shards=2)
    shards = sorted((tmp_path / "corpus").glob("part-*.jsonl"))
    options = {"num_workers": 0, "progress": False}
    build_cache(str(tmp_path / "corpus"), tokenizer_path, str(tmp_path / "cache"), **options)
    size = shards[1].stat().st_size
    with shards[1].open("a") as file:
        file.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(CacheMismatchError) as refused:
        build_cache(str(tmp_path / "corpus"), tokenizer_path, str(tmp_path / "cache"), **options)
    message = str(refused.value)
    assert f"the source file {shards[1]} changed since the cache was built ({size} ->" in message
    assert "rebuild=True" in message and str(shards[0]) not in message
    # The same size with other leading bytes is a change too.
    text = shards[0].read_bytes()
    shards[0].write_bytes(text[:10].swapcase() + text[10:])
    with pytest.raises(CacheMismatchError, match="the same size, other leading bytes"):
        build_cache(str(tmp_path / "corpus"), tokenizer_path, str(tmp_path / "cache"), **options)


def test_a_cache_recorded_before_content_entries_is_reused_with_its_fingerprint(
    tmp_path: Path, tokenizer_path: str
):
    write_jsonl_shards(tmp_path / "corpus", make_documents(40, seed=34), num_shards=2)
    options = {"num_workers": 0, "progress": False}
    out = tmp_path / "cache"
    build_cache(str(tmp_path / "corpus"), tokenizer_path, str(out), **options)
    ledger = json.loads((out / "ledger.json").read_text())
    for shard in ledger["identity"]["shards"]:
        del shard["content"]  # as halyard-data-cache 0.2 wrote it
    (out / "ledger.json").write_text(json.dumps(ledger))
    legacy = TokenCache.open(str(out)).fingerprint
    reused = build_cache(str(tmp_path / "corpus"), tokenizer_path, str(out), **options)
    assert isinstance(reused, TokenCache) and reused.fingerprint == legacy
    assert json.loads((out / "ledger.json").read_text()) == ledger
