"""Preference records (prompt, chosen, rejected): two masked documents per record, read back as pairs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import transformers
from data_helpers import cut_back_to_partial, folder_bytes, make_documents
from tokenizers import Tokenizer

from halyard.data import (
    BadRecordError,
    ExampleFormat,
    Loader,
    MissingFieldError,
    PreferenceDataset,
    TokenCache,
    build_cache,
)

EOS = "<|endoftext|>"
TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def preference_records(count: int, seed: int = 0) -> list[dict]:
    words = make_documents(3 * count, seed=seed, max_words=10)
    return [
        {"prompt": words[3 * i], "chosen": words[3 * i + 1], "rejected": words[3 * i + 2], "id": i}
        for i in range(count)
    ]


def write_records(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def build(source: Path, tokenizer: str, out: Path, example: ExampleFormat | str = "preference", **options):
    cache = build_cache(
        str(source), tokenizer, str(out), example_format=example, num_workers=0, progress=False, **options
    )
    assert isinstance(cache, TokenCache)
    return cache


def expected_simple(tokenizer: Tokenizer, prompt: str, reply: str) -> tuple[list[int], list[int]]:
    """Reference: every piece tokenized alone; the reply's text, end of turn and the EOS are the targets."""
    ids: list[int] = []
    mask: list[int] = []
    for text, target in (("<|user|>\n", 0), (prompt + "\n", 0), ("<|assistant|>\n", 0), (reply + "\n", 1)):
        piece = tokenizer.encode(text, add_special_tokens=False).ids
        ids += piece
        mask += [target] * len(piece)
    return ids + [tokenizer.token_to_id(EOS)], mask + [1]


def test_pairs_are_two_documents_masked_on_the_replies(tmp_path: Path, tokenizer, tokenizer_path):
    records = preference_records(10)
    cache = build(write_records(tmp_path / "pref.jsonl", records), tokenizer_path, tmp_path / "cache")
    assert cache.has_loss_mask and cache.num_documents == 20
    for index, record in enumerate(records):
        for offset, side in enumerate(("chosen", "rejected")):
            start, stop = cache.document_span(2 * index + offset)
            got = (cache.read(start, stop).tolist(), cache.read_loss_mask(start, stop).tolist())
            assert got == expected_simple(tokenizer, record["prompt"], record[side])
    seq_len = 24
    dataset = PreferenceDataset(cache, seq_len, shuffle="none")
    batch = dataset.batch(0, 4)
    assert set(batch) == {"chosen_tokens", "chosen_loss_mask", "rejected_tokens", "rejected_loss_mask"}
    eos = tokenizer.token_to_id(EOS)
    for row in range(4):
        for side in ("chosen", "rejected"):
            tokens, mask = expected_simple(tokenizer, records[row]["prompt"], records[row][side])
            width = seq_len + 1
            padded = (tokens + [eos] * width)[:width]
            assert batch[f"{side}_tokens"][row].tolist() == padded
            assert batch[f"{side}_loss_mask"][row].tolist() == (mask + [0] * width)[:width]
            assert batch[f"{side}_tokens"].dtype == np.int32
    shuffled = PreferenceDataset(cache, seq_len, seed=3)
    assert len(shuffled) == 10
    order = [int(shuffled.windows(np.array([i]))[0]) for i in range(10)]
    assert sorted(order) == list(range(10)) and order != list(range(10))
    assert shuffled.manifest.kind == "preference"


def test_tokenizer_template_renders_as_transformers_and_masks_the_reply(tmp_path: Path, tokenizer):
    folder = tmp_path / "tok"
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS)
    wrapped.chat_template = TEMPLATE
    wrapped.save_pretrained(str(folder))
    records = preference_records(4, seed=2)
    records[1]["prompt"] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "more"},
    ]
    records[1]["chosen"] = [{"role": "assistant", "content": "yes more"}]
    source = write_records(tmp_path / "pref.jsonl", records)
    for template in ("tokenizer", "auto"):
        cache = build(
            source, str(folder), tmp_path / template, ExampleFormat("preference", chat_template=template)
        )
        for index, record in enumerate(records):
            prompt = record["prompt"]
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            before = wrapped.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            for offset, side in enumerate(("chosen", "rejected")):
                reply = record[side]
                reply = [{"role": "assistant", "content": reply}] if isinstance(reply, str) else reply
                full = wrapped.apply_chat_template(prompt + reply, tokenize=False)
                start, stop = cache.document_span(2 * index + offset)
                tokens, mask = cache.read(start, stop).tolist(), cache.read_loss_mask(start, stop).tolist()
                assert tokenizer.decode(tokens[:-1], skip_special_tokens=False) == full
                kept = tokenizer.decode([t for t, m in zip(tokens, mask) if m], skip_special_tokens=False)
                assert kept == full[len(before) :] + EOS
    # auto without a template is the simple one; the identity records what was chosen.
    plain = tmp_path / "plain" / "tokenizer.json"
    plain.parent.mkdir()
    tokenizer.save(str(plain))
    simple = build(source, str(plain), tmp_path / "simple", ExampleFormat("preference", chat_template="auto"))
    assert simple.identity["shards"][0]["example"]["chat_template"] == "simple"
    assert cache.identity["shards"][0]["example"]["chat_template"] == "tokenizer"


def test_a_commit_never_splits_a_pair_and_a_resumed_build_is_identical(tmp_path: Path, tokenizer_path):
    source = write_records(tmp_path / "pref.jsonl", preference_records(60, seed=1))
    common = {"chunk_tokens": 96, "first_chunk_tokens": 40}
    reference = build(source, tokenizer_path, tmp_path / "a", **common)
    ledger = json.loads((tmp_path / "a" / "shards" / "00000" / "ledger.json").read_text())
    assert len(ledger["chunks"]) > 4
    assert all(chunk["documents"] % 2 == 0 for chunk in ledger["chunks"])
    build(source, tokenizer_path, tmp_path / "b", **common)
    cut_back_to_partial(tmp_path / "b", kept_chunks=3)
    resumed = build(source, tokenizer_path, tmp_path / "b", **common)
    assert folder_bytes(tmp_path / "b") == folder_bytes(tmp_path / "a")
    assert resumed.num_documents == reference.num_documents == 120


def test_pairs_stream_while_the_cache_is_built(tmp_path: Path, tokenizer_path):
    source = write_records(tmp_path / "pref.jsonl", preference_records(40, seed=4))
    handle = build_cache(
        str(source),
        tokenizer_path,
        str(tmp_path / "cache"),
        example_format="preference",
        first_chunk_tokens=32,
        num_workers=0,
        progress=False,
        background=True,
    )
    with Loader(PreferenceDataset(handle.cache, 16, shuffle="none"), batch_size=4, stop_step=3) as loader:
        streamed = list(loader)
    finished = PreferenceDataset(handle.wait(), 16, shuffle="none")
    for step, batch in enumerate(streamed):
        expected = finished.batch(step, 4)
        assert all(np.array_equal(batch[key], expected[key]) for key in expected)


def test_bad_preference_records_name_file_and_line(tmp_path: Path, tokenizer_path):
    records = preference_records(3)
    del records[1]["chosen"]
    source = write_records(tmp_path / "missing.jsonl", records)
    message = (
        f"{source}:2: field 'chosen' not found; keys found: ['id', 'prompt', 'rejected']. Set chosen_field"
    )
    with pytest.raises(MissingFieldError, match=re.escape(message)) as missing:
        build(source, tokenizer_path, tmp_path / "c1")
    assert missing.value.option == "chosen_field"
    records = preference_records(3)
    records[2]["rejected"] = [{"role": "user", "content": "not a reply"}]
    source = write_records(tmp_path / "role.jsonl", records)
    with pytest.raises(
        BadRecordError, match=re.escape(f"{source}:3: 'rejected' must hold assistant messages")
    ):
        build(source, tokenizer_path, tmp_path / "c2", strict=True)
    counted = build(source, tokenizer_path, tmp_path / "c3")
    assert counted.num_documents == 4 and counted.totals["counters"]["bad_example"] == 1
    text = build(
        write_records(tmp_path / "text.jsonl", [{"text": "plain words"}]),
        tokenizer_path,
        tmp_path / "t",
        "text",
    )
    with pytest.raises(ValueError, match="holds text examples, not only preference pairs"):
        PreferenceDataset(text, 8)
