"""Load: 256 concurrent streaming requests through ``openai.AsyncOpenAI`` against a ``halyard-serve``
subprocess on a tiny model. Every stream completes with the text and the log-probs (to the bit) its request
gets when sent again (deterministic mode, seeded: nothing lost, duplicated or mixed up between streams, also
for the sequences preempted when the pages run out), clients that disconnect mid-stream free their pages,
malformed requests among them get their 400 and harm no other, and every page is free at the end. Then Ctrl-C
with streams running: they end with an error event and the process exits with code 0 within seconds."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from server_fixtures import MODEL_NAME, WORDS, ServerProcess, start_server, tiny_hf_folder

REQUESTS = 256
LEAVING = range(7, REQUESTS, 16)  # these clients read three chunks and disconnect
MALFORMED = {50: {"temperature": -1.0}, 150: {"prompt": "the " * 200}, 220: {"logit_bias": {"3": 500}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tiny_hf_folder(tmp_path_factory.mktemp("load") / "tiny", seed=3)
    started = start_server(folder, folder.parent / "server.log", "--shutdown-timeout", "1")
    yield started
    started.stop()


def _request(number: int) -> dict[str, Any]:
    draw = random.Random(number)
    leaving = number in LEAVING
    words = [draw.choice(WORDS[4:]) for _ in range(draw.randint(2, 4 if leaving else 40))]
    return {
        "model": MODEL_NAME,
        "prompt": " ".join(words),
        "max_tokens": 88 if leaving else draw.randint(1, 24),
        "temperature": 1.0,
        "seed": number,
        "logprobs": 0,  # each token's log-prob, no alternatives: the same step programs as without
        "extra_body": {"ignore_eos": leaving},
        **MALFORMED.get(number, {}),
    }


async def _stream(client: openai.AsyncOpenAI, number: int) -> tuple[str, Any, list[tuple[str, float]]]:
    """The streamed text, finish reason and tokens with their log-probs of request ``number`` (the error
    for a malformed one)."""
    try:
        stream = await client.completions.create(stream=True, **_request(number))
    except openai.BadRequestError as error:
        return "", error, []
    text, reasons, ids, chunks, tokens = "", [], set(), 0, []
    async for chunk in stream:
        ids.add(chunk.id)
        chunks += 1
        for choice in chunk.choices:
            assert choice.index == 0
            text += choice.text
            if choice.logprobs is not None:
                tokens += zip(choice.logprobs.tokens, choice.logprobs.token_logprobs)
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
        if number in LEAVING and chunks == 3:
            await stream.close()  # the client goes away mid-stream
            return text, "left", tokens
    assert len(ids) == 1 and len(reasons) == 1, (number, ids, reasons)
    return text, reasons[0], tokens


async def _whole(client: openai.AsyncOpenAI, number: int) -> tuple[str, str, list[tuple[str, float]]]:
    answer = await client.completions.create(**_request(number))
    (choice,) = answer.choices
    assert choice.logprobs is not None
    return (
        choice.text,
        choice.finish_reason,
        list(zip(choice.logprobs.tokens, choice.logprobs.token_logprobs)),
    )


def test_256_concurrent_streams_complete_and_free_every_page(server: ServerProcess) -> None:
    async def main() -> tuple[list[tuple[str, Any, list]], list[tuple[str, str, list]]]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600
        ) as client:
            streamed = await asyncio.gather(*[_stream(client, i) for i in range(REQUESTS)])
            kept = [i for i in range(REQUESTS) if i not in LEAVING and i not in MALFORMED]
            whole = await asyncio.gather(*[_whole(client, i) for i in kept])
        return streamed, whole

    before = server.stats()
    started = time.perf_counter()
    streamed, whole = asyncio.run(main())
    seconds = time.perf_counter() - started
    kept = [i for i in range(REQUESTS) if i not in LEAVING and i not in MALFORMED]
    for number, (text, reason, tokens) in zip(kept, whole):
        # the same tokens and log-probs (to the bit) alone or among 255 others
        assert streamed[number] == (text, reason, tokens), (number, streamed[number], (text, reason, tokens))
        assert reason in ("stop", "length")
    for number, fields in MALFORMED.items():
        error = streamed[number][1]
        assert isinstance(error, openai.BadRequestError), (number, error)
        assert error.param == next(iter(fields)), error.body
    assert all(streamed[number][1] == "left" for number in LEAVING)
    stats = _settled(server)
    assert stats["pages_in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0, stats
    accepted = REQUESTS - len(MALFORMED) + len(kept)
    cancelled = stats["requests_cancelled"] - before["requests_cancelled"]
    finished = stats["requests_finished"] - before["requests_finished"]
    assert stats["requests_added"] - before["requests_added"] == accepted
    # A leaving client cancels its request unless the server finished it while the client, busy with 255
    # other streams, was still reading its first chunks: every request either finished or was cancelled.
    assert finished + cancelled == accepted and 1 <= cancelled <= len(LEAVING), (finished, cancelled)
    assert stats["preemptions"] > before["preemptions"]  # the pages ran out on the way, and nothing showed
    print(
        f"{REQUESTS} streams ({cancelled} cancelled), then {len(kept)} whole ones: {seconds:.1f} s; {stats}"
    )


def test_ctrl_c_ends_running_streams_and_exits_with_code_0(server: ServerProcess) -> None:
    async def main() -> list[Any]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600
        ) as client:

            async def long_stream() -> Any:
                stream = await client.completions.create(
                    model=MODEL_NAME,
                    prompt="the word",
                    max_tokens=90,
                    n=3,  # 36 of the 40 pages: 8 samples of 92 tokens could never fit the pool together
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                try:
                    async for _ in stream:
                        pass
                except openai.APIError as error:
                    return error
                return "finished"

            added = server.stats()["requests_added"]
            streams = [asyncio.ensure_future(long_stream()) for _ in range(16)]
            # all 16 accepted (on a loaded machine the last ones can still be on their way) and one running
            while server.stats()["requests_added"] < added + 16 or server.stats()["running"] == 0:
                await asyncio.sleep(0.05)
            signalled.append(time.perf_counter())
            server.process.send_signal(signal.SIGINT)
            return await asyncio.gather(*streams)

    signalled: list[float] = []
    endings = asyncio.run(main())
    # A hang guard with room for a loaded machine: the streams' "shutting down" errors below, not the
    # clock, show the server cut them off after its 1 s drain instead of serving them to their end.
    code = server.process.wait(120)
    seconds = time.perf_counter() - signalled[0]
    assert code == 0, server.output()[-3000:]
    ended = [e for e in endings if isinstance(e, openai.APIError)]
    assert ended and all("shutting down" in str(e) for e in ended), endings
    assert "Application shutdown complete" in server.output()
    print(f"exited {seconds:.1f} s after SIGINT")


def _settled(server: ServerProcess, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if (stats["pages_in_use"] == 0 and stats["requests_in_flight"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)
