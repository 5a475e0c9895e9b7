"""Datasets: windows and segment ids against a numpy reference, shuffles, split, host determinism, mixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_helpers import cut_back_to_partial, make_documents, write_jsonl_shards
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.data import (
    FeistelPermutation,
    LMDataset,
    Loader,
    MixtureDataset,
    TokenCache,
    build_cache,
    host_rows,
)

SEQ_LEN = 16


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: str) -> TokenCache:
    folder = tmp_path_factory.mktemp("datasets")
    write_jsonl_shards(folder / "src", make_documents(400, seed=20), num_shards=2)
    return build_cache(
        str(folder / "src"),
        tokenizer_path,
        str(folder / "cache"),
        num_workers=0,
        chunk_tokens=700,
        progress=False,
    )


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: str) -> TokenCache:
    folder = tmp_path_factory.mktemp("small")
    write_jsonl_shards(folder / "src", make_documents(60, seed=21, max_words=20), num_shards=1)
    return build_cache(
        str(folder / "src"),
        tokenizer_path,
        str(folder / "cache"),
        num_workers=0,
        chunk_tokens=100,
        progress=False,
    )


def reference_segments(stream: np.ndarray, start: int, width: int, eos: int) -> np.ndarray:
    """Independent reference: count the EOS tokens strictly before each position of the window."""
    window = stream[start : start + width]
    return np.concatenate([[0], np.cumsum(window[:-1] == eos)]).astype(np.int32)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31))
def test_feistel_is_a_bijection_for_any_size(size: int, seed: int):
    image = FeistelPermutation(size, (seed,))(np.arange(size))
    assert np.array_equal(np.sort(image), np.arange(size))


def test_feistel_depends_on_the_key_and_rejects_out_of_range():
    first, second = FeistelPermutation(1000, (1, 0)), FeistelPermutation(1000, (1, 1))
    assert not np.array_equal(first(np.arange(1000)), second(np.arange(1000)))
    assert np.array_equal(first(np.arange(1000)), FeistelPermutation(1000, (1, 0))(np.arange(1000)))
    with pytest.raises(IndexError, match=r"\[0, 1000\)"):
        first(np.array([1000]))


def test_unshuffled_windows_tile_the_stream_with_segment_ids(cache: TokenCache):
    dataset = LMDataset(cache, SEQ_LEN, shuffle="none")
    stream = cache.read(0, cache.num_tokens).astype(np.int32)
    count = len(dataset)
    assert count == (cache.num_tokens - 1) // SEQ_LEN
    examples = dataset.examples(np.arange(count))
    inputs_then_last = np.concatenate([examples["tokens"][:, :-1].ravel(), examples["tokens"][-1, -1:]])
    np.testing.assert_array_equal(inputs_then_last, stream[: count * SEQ_LEN + 1])
    eos = cache.processor_metadata["eos_id"]
    for row in [0, 1, count // 2, count - 1]:
        expected = reference_segments(stream, row * SEQ_LEN, SEQ_LEN + 1, eos)
        np.testing.assert_array_equal(examples["segment_ids"][row], expected)
    assert examples["tokens"].dtype == np.int32 and examples["segment_ids"].dtype == np.int32


@pytest.mark.parametrize("shuffle", ["feistel", "era"])
def test_shuffles_visit_every_window_once_per_epoch_and_reshuffle(cache: TokenCache, shuffle: str):
    dataset = LMDataset(cache, SEQ_LEN, seed=3, shuffle=shuffle, era_windows=50)
    count = len(dataset)
    first, second = dataset.windows(np.arange(count)), dataset.windows(np.arange(count, 2 * count))
    assert np.array_equal(np.sort(first), np.arange(count)) and np.array_equal(
        np.sort(second), np.arange(count)
    )
    assert not np.array_equal(first, second) and not np.array_equal(first, np.arange(count))
    if shuffle == "era":
        assert np.array_equal(np.sort(first[:50]), np.arange(50))  # an era stays inside its own windows


@pytest.mark.parametrize("shuffle", ["feistel", "era", "none"])
def test_global_batch_is_identical_for_1_2_4_hosts_and_fresh_objects(cache: TokenCache, shuffle: str):
    for step in [0, 3, 57]:
        single = LMDataset(cache, SEQ_LEN, seed=7, shuffle=shuffle, era_windows=64).batch(step, 8)
        for hosts in [2, 4]:
            dataset = LMDataset(TokenCache.open(cache.root), SEQ_LEN, seed=7, shuffle=shuffle, era_windows=64)
            parts = [dataset.batch(step, 8, host_index=h, host_count=hosts) for h in range(hosts)]
            for key in ("tokens", "segment_ids"):
                np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), single[key])
    with pytest.raises(ValueError, match="not divisible by host_count=3"):
        LMDataset(cache, SEQ_LEN).batch(0, 8, host_index=0, host_count=3)
    assert host_rows(2, 8, 1, 2).tolist() == [20, 21, 22, 23]


def test_validation_split_is_disjoint_and_complete(cache: TokenCache):
    train = LMDataset(cache, SEQ_LEN, seed=5, shuffle="feistel", split="train", validation_fraction=0.1)
    validation = LMDataset(
        cache, SEQ_LEN, seed=5, shuffle="none", split="validation", validation_fraction=0.1
    )
    total = len(LMDataset(cache, SEQ_LEN, shuffle="none"))
    train_windows = train.windows(np.arange(len(train)))
    validation_windows = validation.windows(np.arange(len(validation)))
    assert len(train) + len(validation) == total
    assert not set(train_windows.tolist()) & set(validation_windows.tolist())
    assert set(train_windows.tolist()) | set(validation_windows.tolist()) == set(range(total))
    assert abs(len(validation) - total / 10) <= 1
    assert train.manifest != validation.manifest
    with pytest.raises(ValueError, match="validation_fraction in"):
        LMDataset(cache, SEQ_LEN, split="train")


def test_manifest_identifies_cache_seed_and_settings(cache: TokenCache, small_cache: TokenCache):
    base = LMDataset(cache, SEQ_LEN, seed=1)
    assert base.manifest == LMDataset(TokenCache.open(cache.root), SEQ_LEN, seed=1).manifest
    assert hash(base.manifest) == hash(LMDataset(cache, SEQ_LEN, seed=1).manifest)
    assert base.manifest.differences(LMDataset(cache, SEQ_LEN, seed=2).manifest) == ["seed: 1 -> 2"]
    assert base.manifest != LMDataset(small_cache, SEQ_LEN, seed=1).manifest
    assert base.manifest.to_dict()["settings"]["cache"] == cache.fingerprint


def test_streaming_batches_equal_the_batches_of_the_finished_cache(tmp_path: Path, tokenizer_path: str):
    write_jsonl_shards(tmp_path / "src", make_documents(500, seed=22), num_shards=2)
    settings = dict(num_workers=0, chunk_tokens=150, progress=False)
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), **settings)
    committed = cut_back_to_partial(tmp_path / "c", kept_chunks=8)
    partial = TokenCache.open(str(tmp_path / "c"))
    era = LMDataset(partial, SEQ_LEN, seed=9, shuffle="era", era_windows=32)
    plain = LMDataset(partial, SEQ_LEN, shuffle="none")
    steps = committed // SEQ_LEN // 8 // 4 * 4  # whole eras of 32 examples, 8 per step
    assert steps >= 4 and not partial.is_finished
    streamed = [(era.batch(step, 8), plain.batch(step, 8)) for step in range(steps)]
    finished = build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), **settings)
    for step, (era_batch, plain_batch) in enumerate(streamed):
        again_era = LMDataset(finished, SEQ_LEN, seed=9, shuffle="era", era_windows=32).batch(step, 8)
        again_plain = LMDataset(finished, SEQ_LEN, shuffle="none").batch(step, 8)
        np.testing.assert_array_equal(era_batch["tokens"], again_era["tokens"])
        np.testing.assert_array_equal(plain_batch["segment_ids"], again_plain["segment_ids"])


def test_mixture_blocks_have_exact_counts_and_follow_the_schedule(cache: TokenCache, small_cache: TokenCache):
    big, small = LMDataset(cache, SEQ_LEN, seed=1), LMDataset(small_cache, SEQ_LEN, seed=1, shuffle="none")
    mixture = MixtureDataset(
        {"big": big, "small": small}, [(0, {"big": 3, "small": 1}), (4, {"small": 1})], seed=2, block_size=16
    )
    components, local = mixture.assignments(np.arange(16 * 8), batch_size=16)
    for block in range(4):
        assert np.bincount(components[block * 16 : (block + 1) * 16], minlength=2).tolist() == [12, 4]
    assert (components[64:] == 1).all()
    for index in range(2):  # each component is read in order, without gaps or repeats
        assert sorted(local[components == index].tolist()) == list(range(int((components == index).sum())))
    batch = mixture.batch(5, 16)
    assert (batch["source"] == 1).all()
    np.testing.assert_array_equal(batch["tokens"], small.examples(local[80:96])["tokens"])
    halves = [mixture.batch(2, 16, host_index=h, host_count=2) for h in range(2)]
    np.testing.assert_array_equal(
        np.concatenate([h["tokens"] for h in halves]), mixture.batch(2, 16)["tokens"]
    )
    assert mixture.manifest != MixtureDataset({"big": big, "small": small}, {"big": 1}, seed=2).manifest
    with pytest.raises(ValueError, match="falls inside a block"):
        mixture.batch(0, 6)
    with pytest.raises(ValueError, match=r"unknown datasets \['nope'\]"):
        MixtureDataset({"big": big}, {"nope": 1.0})


def test_loader_prefetches_the_same_batches_and_resumes_by_step(cache: TokenCache):
    dataset = LMDataset(cache, SEQ_LEN, seed=4)
    with Loader(dataset, 8, start_step=0, stop_step=6, host_index=1, host_count=2, prefetch=3) as loader:
        batches = list(loader)
        assert loader.step == 6
    assert len(batches) == 6
    for step, batch in enumerate(batches):
        np.testing.assert_array_equal(batch["tokens"], dataset.batch(step, 8, 1, 2)["tokens"])
    with Loader(dataset, 8, start_step=4, host_index=1, host_count=2) as resumed:
        np.testing.assert_array_equal(next(resumed)["segment_ids"], batches[4]["segment_ids"])
        assert resumed.step == 5


def test_a_cache_shorter_than_one_window_is_a_clear_error(small_cache: TokenCache):
    with pytest.raises(ValueError, match="not one window of seq_len \\+ 1"):
        len(LMDataset(small_cache, seq_len=10**7))


def test_every_position_names_its_document_offset_and_source(cache: TokenCache):
    """document_at against document_span for every token; document_source against the shard files' order."""
    for index in range(cache.num_documents):
        start, stop = cache.document_span(index)
        for position in (start, (start + stop) // 2, stop - 1):
            assert cache.document_at(position) == (index, position - start)
    shards = [cache.document_source(index) for index in range(cache.num_documents)]
    urls = [source["url"] for source, _ in shards]
    assert urls == sorted(urls) and len(set(urls)) == 2  # two shard files, in shard order
    for url in set(urls):
        numbers = [number for (source, number) in shards if source["url"] == url]
        assert numbers == list(range(len(numbers)))  # each shard's documents numbered from 0
    with pytest.raises(IndexError, match="outside the cache"):
        cache.document_at(cache.num_tokens)
