"""The OpenAI-compatible server's answers, through the official ``openai`` client, against the
``halyard-serve`` subprocess these tests share with test_server_operation.py (`server_fixtures`: one start)
serving a tiny Llama folder: completions and chat against the model's own full forward and transformers'
chat template, streaming against the whole answer, log-probs, echo, n, seeds, finish reasons, usage and
stop strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
from server_fixtures import EOT, MESSAGES, MODEL_NAME, PROMPT, ServerProcess
from tiny_models import forward_logprobs, greedy_reference, logprob_tolerance
from tokenizers import Tokenizer


def test_models_health_and_metrics(client: openai.OpenAI, server: ServerProcess) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    metrics = httpx.get(server.url + "/metrics").text
    assert (
        "halyard_serve_pages_total 160.0" in metrics and "# TYPE halyard_serve_pages_in_use gauge" in metrics
    )
    stats = server.stats()
    for key in (
        "waiting",
        "running",
        "pages_in_use",
        "tokens_per_second",
        "requests_added",
        "compile_seconds",
    ):
        assert key in stats


def test_greedy_completion_equals_the_full_forward(
    client: openai.OpenAI, tokenizer: Tokenizer, model: Any
) -> None:
    prompt_ids = tokenizer.encode(PROMPT).ids
    answer = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    tokens, logprobs = greedy_reference(model, prompt_ids, 8)
    (choice,) = answer.choices
    assert choice.text == tokenizer.decode(tokens) and choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    atol = logprob_tolerance(model, [prompt_ids + tokens])
    np.testing.assert_allclose(choice.logprobs.token_logprobs, logprobs, atol=atol, rtol=0)
    assert choice.logprobs.tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    reference = forward_logprobs(model, prompt_ids + tokens)
    for position, alternatives in enumerate(choice.logprobs.top_logprobs or []):
        best = np.argsort(-reference[len(prompt_ids) - 1 + position])[:3]
        expected = {tokenizer.decode([int(t)], skip_special_tokens=False) for t in best}
        assert expected <= set(alternatives)  # the sampled token is added when not among the top 3
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(prompt_ids), 8)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=prompt_ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == choice.text


def test_chat_renders_the_tokenizer_template(
    client: openai.OpenAI, folder: Path, tokenizer: Tokenizer
) -> None:
    import transformers

    rendered = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_completion_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )  # type: ignore[arg-type]
    completion = client.completions.create(
        model=MODEL_NAME, prompt=list(rendered), max_tokens=6, temperature=0
    )
    (choice,) = chat.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == completion.choices[0].text
    assert choice.finish_reason == completion.choices[0].finish_reason
    assert chat.usage is not None and chat.usage.prompt_tokens == len(rendered)
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == chat.usage.completion_tokens
    for entry in choice.logprobs.content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
        assert entry.bytes == list(entry.token.encode())
    parts = [{"type": "text", "text": "how are"}, {"type": "text", "text": "you"}]
    as_parts = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[MESSAGES[0], {"role": "user", "content": parts}],  # type: ignore[list-item]
        max_completion_tokens=6,
        temperature=0,
    )
    assert as_parts.choices[0].message.content == choice.message.content  # "how are\nyou": same words


def _streamed_text(stream: Any, choices: int) -> tuple[list[str], list[str | None], Any]:
    texts, reasons, usage = [""] * choices, [None] * choices, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.text if hasattr(choice, "text") else (choice.delta.content or "")
            texts[choice.index] += piece
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    return texts, reasons, usage


def test_streamed_text_equals_the_whole_answer_for_the_same_seed(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=12, temperature=1.0, top_p=0.9, seed=5, n=2)
    whole = client.completions.create(prompt=[PROMPT, "how are you"], **settings)
    stream = client.completions.create(
        prompt=[PROMPT, "how are you"], stream=True, stream_options={"include_usage": True}, **settings
    )
    texts, reasons, usage = _streamed_text(stream, 4)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]  # prompt i, sample j: choice i * n + j
    assert texts == [c.text for c in whole.choices]
    assert reasons == [c.finish_reason for c in whole.choices]
    assert usage == whole.usage

    chat_settings: dict[str, Any] = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, seed=9, n=2)
    whole_chat = client.chat.completions.create(**chat_settings)
    chat_stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **chat_settings
    )
    texts, reasons, usage = _streamed_text(chat_stream, 2)
    assert texts == [c.message.content for c in whole_chat.choices]
    assert reasons == [c.finish_reason for c in whole_chat.choices]
    assert usage == whole_chat.usage


def test_streamed_log_probs_equal_the_whole_ones(client: openai.OpenAI) -> None:
    settings: dict[str, Any] = dict(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, seed=2, logprobs=2, echo=True
    )
    whole = client.completions.create(**settings).choices[0]
    tokens, logprobs = [], []
    for chunk in client.completions.create(stream=True, **settings):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens or []
                logprobs += choice.logprobs.token_logprobs or []
    assert whole.logprobs is not None
    assert tokens == whole.logprobs.tokens and logprobs == whole.logprobs.token_logprobs


def test_echo_scores_the_prompt(client: openai.OpenAI, tokenizer: Tokenizer, model: Any) -> None:
    prompt_ids = tokenizer.encode(PROMPT).ids
    scored = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    (choice,) = scored.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs is not None
    assert choice.logprobs.top_logprobs[0] is None
    reference = forward_logprobs(model, prompt_ids)
    expected = [reference[i - 1, prompt_ids[i]] for i in range(1, len(prompt_ids))]
    atol = logprob_tolerance(model, [prompt_ids])
    np.testing.assert_allclose(choice.logprobs.token_logprobs[1:], expected, atol=atol, rtol=0)
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    continued = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=4, echo=True, temperature=0
    )
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0)
    assert continued.choices[0].text == PROMPT + plain.choices[0].text


def test_seeds_n_and_finish_reasons(client: openai.OpenAI, tokenizer: Tokenizer, model: Any) -> None:
    def sample(seed: int, n: int = 1) -> list[str]:
        answer = client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            n=n,
            extra_body={"ignore_eos": True},
        )
        return [c.text for c in answer.choices]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    three = sample(7, n=3)
    assert len(set(three)) == 3  # n samples draw different continuations

    greedy, _ = greedy_reference(model, tokenizer.encode(PROMPT).ids, 6)
    stop_token = greedy[3]
    ended = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        extra_body={"stop_token_ids": [stop_token]},
    )
    choice = ended.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == stop_token  # type: ignore[attr-defined]
    assert choice.text == tokenizer.decode(greedy[: greedy.index(stop_token)])
    assert EOT not in greedy  # so the 6 tokens above ended by length, not by the end-of-turn token


def test_several_stop_strings_each_end_the_text_where_it_starts(
    client: openai.OpenAI, tokenizer: Tokenizer, model: Any
) -> None:
    greedy, _ = greedy_reference(model, tokenizer.encode(PROMPT).ids, 12)
    full = tokenizer.decode(greedy)
    words = full.split()
    early, late = " " + words[3], " " + words[6]

    def answer(stop: Any) -> Any:
        return client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop
        )

    def first_stop(stops: list[str]) -> tuple[int, str]:
        return min((full.find(s), s) for s in stops if s in full)

    for stops in ([late, early], [early], late, [late, "never"]):
        expected = first_stop([stops] if isinstance(stops, str) else stops)
        choice = answer(stops).choices[0]
        assert choice.text == full[: expected[0]] and choice.finish_reason == "stop", stops
        assert choice.stop_reason == expected[1]  # type: ignore[attr-defined]
    streamed, _, _ = _streamed_text(
        client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=[late, early], stream=True
        ),
        1,
    )
    assert streamed == [full[: first_stop([late, early])[0]]]
