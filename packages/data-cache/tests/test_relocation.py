"""A folder holding a corpus and its cache can be moved: shards inside ``relative_to`` are recorded by
their path inside it, so the moved cache is reused, not refused as built from other sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from data_helpers import folder_bytes, make_documents, write_jsonl_shards

from halyard.data import TokenCache, build_cache


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
