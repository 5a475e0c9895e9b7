"""``halyard-serve --speculative ngram`` through the official ``openai`` client: greedy answers equal the
unspeculated engine's tokens, streamed and not, with logprobs, stop strings and max_tokens; seeded sampling
reproducible; proposals accepted (``/stats``); a draft model's server; the option's one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from server_fixtures import MODEL_NAME, PROMPT, ServerProcess, start_server
from tiny_models import greedy_reference
from tokenizers import Tokenizer

from halyard.serve.server.cli import main

REPEATING = f"{PROMPT} {PROMPT} {PROMPT}"
"""A prompt that repeats itself: prompt lookup finds proposals in it."""


@pytest.fixture(scope="module")
def speculative(folder: Path) -> Iterator[ServerProcess]:
    log = folder.parent / "speculative-server.log"
    server = start_server(folder, log, "--speculative", "ngram", "--speculative-tokens", "3")
    try:
        yield server
    finally:
        assert server.stop() == 0, server.output()[-3000:]


@pytest.fixture(scope="module")
def client(speculative: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=speculative.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_greedy_answers_are_the_models(
    client: openai.OpenAI, speculative: ServerProcess, tokenizer: Tokenizer, model: Any
) -> None:
    tokens, _ = greedy_reference(model, tokenizer.encode(REPEATING).ids, 24)
    expected = tokenizer.decode(tokens)
    answer = client.completions.create(
        model=MODEL_NAME, prompt=REPEATING, max_tokens=24, temperature=0, logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    (choice,) = answer.choices
    assert choice.text == expected and choice.finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 24
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == 24
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=REPEATING, max_tokens=24, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected
    stats = speculative.stats()
    assert 0 < stats["tokens_accepted"] <= stats["tokens_proposed"]


def test_stop_strings_and_seeds(client: openai.OpenAI, tokenizer: Tokenizer, model: Any) -> None:
    tokens, _ = greedy_reference(model, tokenizer.encode(REPEATING).ids, 16)
    words = tokenizer.decode(tokens).split()
    stop = words[len(words) // 2]
    answer = client.completions.create(
        model=MODEL_NAME, prompt=REPEATING, max_tokens=16, temperature=0, stop=[stop],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    (choice,) = answer.choices
    assert choice.finish_reason == "stop" and stop not in choice.text.split()
    assert tokenizer.decode(tokens).startswith(choice.text.rstrip())
    sampled = [
        client.completions.create(
            model=MODEL_NAME,
            prompt=REPEATING,
            max_tokens=16,
            temperature=1.0,
            seed=11,
            n=2,
            extra_body={"ignore_eos": True},
        )
        for _ in range(2)
    ]
    assert [c.text for c in sampled[0].choices] == [c.text for c in sampled[1].choices]


def test_draft_model_server(folder: Path, tokenizer: Tokenizer, model: Any) -> None:
    """``--speculative draft=FOLDER`` (the served folder as its own draft: every proposal kept)."""
    server = start_server(
        folder,
        folder.parent / "draft-server.log",
        "--speculative",
        f"draft={folder}",
        "--speculative-tokens",
        "3",
    )
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        tokens, _ = greedy_reference(model, tokenizer.encode(PROMPT).ids, 12)
        answer = client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert answer.choices[0].text == tokenizer.decode(tokens)
        stats = server.stats()
        assert stats["tokens_accepted"] == stats["tokens_proposed"] > 0
    finally:
        assert server.stop() == 0, server.output()[-3000:]


def test_bad_values_are_one_line_errors(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    assert main(["--hf", str(folder), "--speculative", "medusa"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --speculative medusa: give ngram (prompt lookup) or draft=MODEL")
    assert main(["--hf", str(folder), "--speculative", "ngram", "--speculative-tokens", "0"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --speculative-tokens must be a positive int")
