"""Builds shared between hosts, stopped builds, and readers that wait for a build (rate, failures)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import folder_bytes, make_documents, write_jsonl, write_jsonl_shards

from halyard.data import TokenCache, build_cache


def _without_locks(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if not name.startswith(".build.lock")}


def test_hosts_build_their_shares_into_one_cache_equal_to_a_single_build(tmp_path: Path, tokenizer_path: str):
    write_jsonl_shards(tmp_path / "src", make_documents(200, seed=21), num_shards=5)
    common = {"num_workers": 0, "chunk_tokens": 300, "progress": False}
    single = build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "single"), **common)
    assert isinstance(single, TokenCache) and single.is_finished

    host_1 = build_cache(
        str(tmp_path / "src"), tokenizer_path, str(tmp_path / "shared"), host_index=1, host_count=2, **common
    )
    assert isinstance(host_1, TokenCache)
    # Host 1 built shards 1 and 3 only; the cache waits for host 0's shards (nothing readable yet).
    assert not host_1.is_finished and host_1.num_tokens == 0
    status = host_1.build_status()
    assert status.shards_finished == 2 and status.tokens > 0 and not status.finished
    assert sorted(p.name for p in (tmp_path / "shared" / "shards").iterdir()) == ["00001", "00003"]

    handle = build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "shared"),
        host_index=0,
        host_count=2,
        background=True,
        **common,
    )
    assert handle.shards == [0, 2, 4]
    assert handle.wait(timeout=300).is_finished  # host 0 finished last: it wrote the finished ledger
    assert _without_locks(folder_bytes(tmp_path / "shared")) == _without_locks(
        folder_bytes(tmp_path / "single")
    )


def test_bad_host_share_is_refused(tmp_path: Path, tokenizer_path: str):
    write_jsonl(tmp_path / "a.jsonl", ["a b"])
    with pytest.raises(ValueError, match=r"host_index=2 must be in \[0, host_count=2\)"):
        build_cache(
            str(tmp_path / "a.jsonl"), tokenizer_path, str(tmp_path / "c"), host_index=2, host_count=2
        )


def test_a_stopped_build_ends_its_workers_and_resumes_to_the_same_bytes(tmp_path: Path, tokenizer_path: str):
    write_jsonl_shards(tmp_path / "src", make_documents(800, seed=22, max_words=200), num_shards=4)
    common = {"chunk_tokens": 2000, "progress": False}
    handle = build_cache(
        str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), num_workers=2, background=True, **common
    )
    handle.stop(timeout=300)  # a hang guard; the unfinished cache below shows the stop cut the build short
    assert handle.done() and not handle.errors
    assert not TokenCache.open(str(tmp_path / "c")).is_finished
    resumed = build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), num_workers=0, **common)
    reference = build_cache(
        str(tmp_path / "src"), tokenizer_path, str(tmp_path / "r"), num_workers=0, **common
    )
    assert isinstance(resumed, TokenCache) and resumed.is_finished
    assert _without_locks(folder_bytes(tmp_path / "c")) == _without_locks(folder_bytes(tmp_path / "r"))
    assert isinstance(reference, TokenCache)


def test_waiting_read_names_the_missing_tokens_and_the_build_rate(
    tmp_path: Path, tokenizer_path: str, capsys
):
    write_jsonl_shards(tmp_path / "src", make_documents(2000, seed=23), num_shards=2)
    handle = build_cache(
        str(tmp_path / "src"),
        tokenizer_path,
        str(tmp_path / "c"),
        num_workers=0,
        chunk_tokens=500,
        first_chunk_tokens=100,
        progress=False,
        background=True,
    )
    reader = TokenCache.open(str(tmp_path / "c"), wait_message_seconds=0.0)
    reader.wait_for_tokens(10**9)  # more than the corpus: returns when the cache is finished
    handle.wait()
    shown = capsys.readouterr().err
    assert "more than are readable" in shown and "tokens/s)" in shown and "shards finished" in shown
