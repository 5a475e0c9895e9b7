"""``halyard-serve --quantization int8`` through the official ``openai`` client: one server (deterministic mode,
the shared tiny folder) whose greedy answers are the int8 model's full forward; the loader quantizing on the
device; the option's one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from server_fixtures import MESSAGES, MODEL_NAME, PROMPT, ServerProcess, start_server
from tiny_models import greedy_reference, logprob_tolerance
from tokenizers import Tokenizer

from halyard.serve.int8_weights import Int8HeadModel, quantized
from halyard.serve.server import load_hf_folder
from halyard.serve.server.cli import main


@pytest.fixture(scope="module")
def int8_client(folder: Path) -> Iterator[openai.OpenAI]:
    server: ServerProcess = start_server(folder, folder.parent / "int8-server.log", "--quantization", "int8")
    try:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    finally:
        assert server.stop() == 0, server.output()[-3000:]


def test_greedy_completion_is_the_int8_models(
    int8_client: openai.OpenAI, tokenizer: Tokenizer, model: Any
) -> None:
    prompt_ids = tokenizer.encode(PROMPT).ids
    answer = int8_client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    int8_model = quantized(model, "int8")
    tokens, logprobs = greedy_reference(int8_model, prompt_ids, 8)
    (choice,) = answer.choices
    assert choice.text == tokenizer.decode(tokens)
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    atol = logprob_tolerance(int8_model, [prompt_ids + tokens])
    np.testing.assert_allclose(choice.logprobs.token_logprobs, logprobs, atol=atol, rtol=0)
    _, float_logprobs = greedy_reference(model, prompt_ids, 8)  # the float weights' differ: int8 ran
    assert np.abs(np.subtract(float_logprobs, logprobs)).max() > 10 * atol


def test_chat_answers(int8_client: openai.OpenAI) -> None:
    answer = int8_client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.completion_tokens <= 4


def test_bad_values_are_one_line_errors(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--hf", str(folder), "--quantization", "int4"])
    assert stopped.value.code == 2
    assert "argument --quantization: invalid choice: 'int4'" in capsys.readouterr().err
    assert main(["--hf", str(folder), "--quantization", "int8", "--training-arithmetic"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --quantization='int8' does not go with --training-arithmetic")


def test_the_loader_quantizes_on_the_device(folder: Path) -> None:
    """``load_hf_folder(quantization="int8")`` (what ``--quantization int8`` loads with): the served model is
    int8 before the engine starts, so no full-precision copy outlives the loading."""
    assert isinstance(load_hf_folder(folder, quantization="int8").model, Int8HeadModel)
    with pytest.raises(ValueError, match="^quantization must be one of none, int8, got 'int4'$"):
        load_hf_folder(folder, quantization="int4")
