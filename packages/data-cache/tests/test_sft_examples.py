"""Chat and prompt/completion examples: the cache stores exactly the target tokens as its loss mask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from data_helpers import cut_back_to_partial, folder_bytes, make_documents, write_jsonl
from tokenizers import Tokenizer

from halyard.data import (
    BadRecordError,
    ExampleFormat,
    LMDataset,
    Loader,
    MissingFieldError,
    MixtureDataset,
    TokenCache,
    build_cache,
)

EOS = "<|endoftext|>"


def write_records(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def chats(count: int, seed: int = 0) -> list[dict]:
    """Chats of random words: an optional system turn, then user/assistant pairs (1 to 3)."""
    rng = np.random.default_rng(seed)
    words = make_documents(4 * count, seed=seed, max_words=12)
    records = []
    for index in range(count):
        messages = [{"role": "system", "content": "be brief"}] if index % 2 else []
        for turn in range(int(rng.integers(1, 4))):
            messages.append({"role": "user", "content": words[4 * index + turn]})
            messages.append({"role": "assistant", "content": words[4 * index + turn + 1]})
        records.append({"messages": messages, "id": index})
    return records


def expected_chat(tokenizer: Tokenizer, record: dict, markers: dict[str, str], end: str):
    """Reference: each piece tokenized alone; targets are the assistant's content + end of turn, and EOS."""
    ids: list[int] = []
    mask: list[int] = []
    for message in record["messages"]:
        for text, target in ((markers[message["role"]], 0), (message["content"] + end, 0)):
            if message["role"] == "assistant" and text != markers["assistant"]:
                target = 1
            piece = tokenizer.encode(text, add_special_tokens=False).ids
            ids += piece
            mask += [target] * len(piece)
    eos_target = int(record["messages"][-1]["role"] == "assistant")
    return ids + [tokenizer.token_to_id(EOS)], mask + [eos_target]


def cache_examples(cache: TokenCache) -> list[tuple[list[int], list[int]]]:
    """(tokens, mask) of every example of the cache, read back through the public reader."""
    out = []
    start = 0
    for index in range(cache.num_documents):
        tokens = cache.document(index)
        mask = cache.read_loss_mask(start, start + len(tokens))
        out.append((tokens.tolist(), mask.tolist()))
        start += len(tokens)
    return out


def test_chat_mask_is_exactly_the_assistant_tokens(tmp_path: Path, tokenizer, tokenizer_path):
    records = chats(12)
    write_records(tmp_path / "chat.jsonl", records)
    markers = {"system": "### System: ", "user": "### User: ", "assistant": "### Assistant: "}
    example = ExampleFormat(
        kind="chat",
        system_marker=markers["system"],
        user_marker=markers["user"],
        assistant_marker=markers["assistant"],
        end_of_turn="\n\n",
    )
    cache = build_cache(
        str(tmp_path / "chat.jsonl"),
        tokenizer_path,
        str(tmp_path / "cache"),
        example_format=example,
        num_workers=0,
        progress=False,
    )
    assert isinstance(cache, TokenCache) and cache.has_loss_mask
    got = cache_examples(cache)
    assert got == [expected_chat(tokenizer, record, markers, "\n\n") for record in records]
    # The masked tokens decode to the assistant turns, nothing else.
    tokens, mask = got[0]
    kept = tokenizer.decode([t for t, m in zip(tokens, mask) if m], skip_special_tokens=True)
    assistant = "".join(m["content"] + "\n\n" for m in records[0]["messages"] if m["role"] == "assistant")
    assert kept == assistant


def test_prompt_completion_with_custom_fields_and_bos(tmp_path: Path, tokenizer_path):
    records = [{"q": f"question {i} of", "a": f" answer {i} alpha"} for i in range(5)]
    write_records(tmp_path / "pc.jsonl", records)
    example = ExampleFormat(kind="prompt_completion", prompt_field="q", completion_field="a")
    cache = build_cache(
        str(tmp_path / "pc.jsonl"),
        tokenizer_path,
        str(tmp_path / "cache"),
        example_format=example,
        bos="<s>",
        num_workers=0,
        progress=False,
    )
    tokenizer = Tokenizer.from_file(tokenizer_path)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id(EOS)
    for record, (tokens, mask) in zip(records, cache_examples(cache), strict=True):
        prompt = tokenizer.encode(record["q"], add_special_tokens=False).ids
        completion = tokenizer.encode(record["a"], add_special_tokens=False).ids
        assert tokens == [bos, *prompt, *completion, eos]
        assert mask == [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)


def test_tokenizer_chat_template_matches_transformers(tmp_path: Path, tokenizer):
    template = (
        "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    folder = tmp_path / "tok"
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS)
    wrapped.chat_template = template
    wrapped.save_pretrained(str(folder))
    records = chats(4, seed=3)
    write_records(tmp_path / "chat.jsonl", records)
    example = ExampleFormat(kind="chat", chat_template="tokenizer")
    cache = build_cache(
        str(tmp_path / "chat.jsonl"),
        str(folder),
        str(tmp_path / "cache"),
        example_format=example,
        num_workers=0,
        progress=False,
    )
    for record, (tokens, mask) in zip(records, cache_examples(cache), strict=True):
        rendered = wrapped.apply_chat_template(record["messages"], tokenize=False)
        # Same text as transformers renders (the special tokens in the text become their ids).
        assert tokenizer.decode(tokens[:-1], skip_special_tokens=False) == rendered
        expected_targets = "".join(
            m["content"] + "</s>\n" for m in record["messages"] if m["role"] == "assistant"
        )
        kept = tokenizer.decode([t for t, m in zip(tokens, mask) if m], skip_special_tokens=False)
        assert kept == expected_targets + EOS
    with pytest.raises(ValueError, match="has no chat_template"):
        build_cache(
            str(tmp_path / "chat.jsonl"),
            _plain_tokenizer(tmp_path, tokenizer),
            str(tmp_path / "cache2"),
            example_format=example,
            num_workers=0,
            progress=False,
        )


def _plain_tokenizer(tmp_path: Path, tokenizer: Tokenizer) -> str:
    path = tmp_path / "plain" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return str(path)


def test_resumed_and_parallel_builds_write_the_same_tokens_and_masks(tmp_path: Path, tokenizer_path):
    for shard in range(2):
        write_records(tmp_path / "src" / f"part-{shard}.jsonl", chats(40, seed=shard))
    common = {"example_format": "chat", "chunk_tokens": 256, "first_chunk_tokens": 64, "progress": False}
    reference = build_cache(
        str(tmp_path / "src"), tokenizer_path, str(tmp_path / "a"), num_workers=0, **common
    )
    assert isinstance(reference, TokenCache)
    assert len(list((tmp_path / "a").rglob("*.mask"))) == reference.totals["chunks"] > 4
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "b"), num_workers=2, **common)
    assert folder_bytes(tmp_path / "b") == folder_bytes(tmp_path / "a")
    build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), num_workers=0, **common)
    cut_back_to_partial(tmp_path / "c", kept_chunks=2)
    resumed = build_cache(str(tmp_path / "src"), tokenizer_path, str(tmp_path / "c"), num_workers=0, **common)
    assert cache_examples(resumed) == cache_examples(reference)
    assert folder_bytes(tmp_path / "c") == folder_bytes(tmp_path / "a")


def test_loader_yields_the_mask_of_each_window_while_the_cache_is_built(tmp_path: Path, tokenizer_path):
    write_records(tmp_path / "chat.jsonl", chats(30))
    handle = build_cache(
        str(tmp_path / "chat.jsonl"),
        tokenizer_path,
        str(tmp_path / "cache"),
        example_format="chat",
        first_chunk_tokens=32,
        num_workers=0,
        progress=False,
        background=True,
    )
    seq_len = 16
    dataset = LMDataset(handle.cache, seq_len, shuffle="none")
    with Loader(dataset, batch_size=4, stop_step=3) as loader:
        batches = list(loader)
    cache = handle.wait()
    stream_mask = cache.read_loss_mask(0, cache.num_tokens)
    stream_tokens = cache.read(0, cache.num_tokens)
    for step, batch in enumerate(batches):
        assert set(batch) == {"tokens", "segment_ids", "loss_mask"}
        assert batch["loss_mask"].shape == batch["tokens"].shape and batch["loss_mask"].dtype == np.int32
        for row in range(4):
            start = (step * 4 + row) * seq_len
            np.testing.assert_array_equal(batch["tokens"][row], stream_tokens[start : start + seq_len + 1])
            np.testing.assert_array_equal(batch["loss_mask"][row], stream_mask[start : start + seq_len + 1])
    assert 0 < stream_mask.mean() < 1


def test_mixture_of_text_and_chat_has_ones_on_text_rows(tmp_path: Path, tokenizer_path):
    write_records(tmp_path / "chat.jsonl", chats(20))
    write_jsonl(tmp_path / "text.jsonl", make_documents(20))
    chat_cache = build_cache(
        str(tmp_path / "chat.jsonl"),
        tokenizer_path,
        str(tmp_path / "c1"),
        example_format="chat",
        num_workers=0,
    )
    text_cache = build_cache(
        str(tmp_path / "text.jsonl"), tokenizer_path, str(tmp_path / "c2"), num_workers=0
    )
    assert isinstance(chat_cache, TokenCache) and isinstance(text_cache, TokenCache)
    assert not text_cache.has_loss_mask
    with pytest.raises(ValueError, match="has no loss mask"):
        text_cache.read_loss_mask(0, 4)
    assert "loss_mask" not in LMDataset(text_cache, 8).batch(0, 2)
    mixture = MixtureDataset(
        {"chat": LMDataset(chat_cache, 8, shuffle="none"), "text": LMDataset(text_cache, 8, shuffle="none")},
        {"chat": 0.5, "text": 0.5},
    )
    batch = mixture.batch(0, 8)
    text_rows = batch["source"] == 1
    assert text_rows.any() and (~text_rows).any()
    assert (batch["loss_mask"][text_rows] == 1).all()
    assert (batch["loss_mask"][~text_rows] == 0).any()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]},
            "unknown role",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "assistant", "content": 3}]}, "not a string"),
        ({"messages": []}, "non-empty list"),
    ],
)
def test_bad_chats_fail_with_file_and_line_or_are_counted(tmp_path: Path, tokenizer_path, record, message):
    good = chats(2)
    source = write_records(tmp_path / "bad.jsonl", [good[0], record, good[1]])
    with pytest.raises(BadRecordError, match=rf"bad\.jsonl:2: .*{message}"):
        build_cache(
            str(source),
            tokenizer_path,
            str(tmp_path / "s"),
            example_format="chat",
            strict=True,
            num_workers=0,
        )
    cache = build_cache(
        str(source), tokenizer_path, str(tmp_path / "l"), example_format="chat", num_workers=0
    )
    assert isinstance(cache, TokenCache)
    assert cache.num_documents == 2 and cache.totals["counters"]["bad_example"] == 1


def test_missing_fields_and_unsupported_sources_are_named(tmp_path: Path, tokenizer_path):
    source = write_records(tmp_path / "pc.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "only"}])
    with pytest.raises(MissingFieldError, match=r"pc\.jsonl:2: field 'completion' not found; keys found"):
        build_cache(str(source), tokenizer_path, str(tmp_path / "c"), example_format="prompt_completion")
    chat = write_records(tmp_path / "chat.jsonl", [{"conversation": []}])
    with pytest.raises(MissingFieldError, match=r"chat\.jsonl:1: messages field 'messages' not found"):
        build_cache(str(chat), tokenizer_path, str(tmp_path / "d"), example_format="chat", num_workers=0)
    (tmp_path / "doc.txt").write_text("plain text")
    with pytest.raises(ValueError, match="read from jsonl or json files, not text"):
        build_cache(str(tmp_path / "doc.txt"), tokenizer_path, str(tmp_path / "e"), example_format="chat")
    with pytest.raises(ValueError, match="example format 'dialogue' is not known"):
        ExampleFormat(kind="dialogue")


def test_command_line_builds_a_prompt_completion_cache(tmp_path: Path, tokenizer_path, capsys):
    from halyard.data.cli import main

    source = write_records(tmp_path / "pc.jsonl", [{"in": "say", "out": " alpha beta"}])
    arguments = [
        "build",
        "--source",
        str(source),
        "--tokenizer",
        tokenizer_path,
        "--out",
        str(tmp_path / "c"),
    ]
    options = ["--example-format", "prompt_completion", "--prompt-field", "in", "--completion-field", "out"]
    assert main([*arguments, *options, "--workers", "0", "--no-progress"]) == 0
    assert main(["info", str(tmp_path / "c"), "--json"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{") :])["loss_mask"] is True
    tokenizer = Tokenizer.from_file(tokenizer_path)
    prompt = tokenizer.encode("say", add_special_tokens=False).ids
    ((tokens, mask),) = cache_examples(TokenCache.open(str(tmp_path / "c")))
    assert mask == [0] * len(prompt) + [1] * (len(tokens) - len(prompt))


def test_chat_template_is_read_from_tokenizer_config(tmp_path: Path, tokenizer):
    from halyard.data.processing import load_tokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "chat_template": template}))
    spec = load_tokenizer(str(folder))
    assert spec.chat_template == template and spec.eos_token == EOS
    listed = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": listed}))
    assert load_tokenizer(str(folder)).chat_template == template


def test_template_that_is_not_prefix_stable_is_refused_per_record(tmp_path: Path, tokenizer):
    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    # Renders the number of messages first: a longer chat does not extend a shorter one.
    template = "{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    source = write_records(tmp_path / "chat.jsonl", chats(1))
    example = ExampleFormat(kind="chat", chat_template="tokenizer")
    with pytest.raises(BadRecordError, match=r"chat\.jsonl:1: .*use chat_template='simple'"):
        build_cache(
            str(source), str(folder), str(tmp_path / "c"), example_format=example, strict=True, num_workers=0
        )
