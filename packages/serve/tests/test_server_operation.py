"""The OpenAI-compatible server in operation, against the ``halyard-serve`` subprocess these tests share with
test_server_answers.py (`server_fixtures`: one start): every error with its status and parameter, the API
key, a client that leaves freeing its pages, the limit on ``n`` and fair admission beside a maximal request,
the READMEs' python blocks, a unix socket, tensor parallel and replicas."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import io
import re
import time
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from server_fixtures import (
    API_KEY,
    ENGINE_OPTIONS,
    MAX_N,
    MESSAGES,
    MODEL_NAME,
    PROMPT,
    ServerProcess,
    post,
    start_server,
    tiny_hf_folder,
)

from halyard.serve.server import (
    OptionError,
    ServedModel,
    add_server_arguments,
    build_engine,
    create_app,
    engine_config_of,
    load_hf_folder,
)

REPOSITORY = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)

ERRORS: list[tuple[str, dict[str, Any], str | None]] = [
    ("/v1/completions", {"prompt": list(range(1, 50)) * 2, "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 200}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 200}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "the " * 120}]}, "messages"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": PROMPT, "n": 0}, "n"),
    ("/v1/completions", {"prompt": PROMPT, "seed": -1}, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": [1000]}, "prompt"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "stop": [1]}, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "temprature": 0.5}, "temprature"),
    ("/v1/completions", {"prompt": PROMPT, "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"five": 10}}, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "response_format": {"type": "yaml"}}, "response_format"),
    # a word-level tokenizer without a decoder: llguidance cannot read it, so nothing can be constrained
    (
        "/v1/chat/completions",
        {"messages": MESSAGES, "response_format": {"type": "json_object"}},
        "response_format",
    ),
    ("/v1/completions", {"prompt": PROMPT, "presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "suffix": "end"}, "suffix"),
    ("/v1/completions", {"prompt": PROMPT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
    ("/v1/chat/completions", {"messages": []}, "messages"),
]


def programs(stats: dict) -> int:
    """Step programs a server compiled or read from the compilation cache so far."""
    return stats["programs_compiled"] + stats["programs_loaded"]


@pytest.mark.parametrize(("path", "body", "param"), ERRORS, ids=[f"{e[2]}-{i}" for i, e in enumerate(ERRORS)])
def test_bad_requests_get_a_400_naming_the_parameter(
    server: ServerProcess, path: str, body: dict[str, Any], param: str | None
) -> None:
    response = post(server, path, {"model": MODEL_NAME, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    if param is None:  # the content part's type: pydantic's location
        assert error["param"].startswith("messages[0].content")
    else:
        assert error["param"] == param and error["message"].startswith(param), error
    if param == "temprature":
        assert "did you mean 'temperature'" in error["message"]
    if param in ("prompt", "messages") and "context" in error["message"]:
        assert error["code"] == "context_length_exceeded"


def test_the_openai_client_sees_the_same_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=500)
    assert raised.value.status_code == 400 and raised.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError) as raised:  # OpenAI's answer to a model it does not serve
        client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    assert raised.value.param == "model" and raised.value.code == "model_not_found"


def test_bad_json_the_api_key_and_unknown_routes(server: ServerProcess) -> None:
    for body in (b'{"model": "tiny", "prompt": ', b"[1, 2]", b"\xff"):
        response = post(server, "/v1/completions", body)
        assert response.status_code == 400 and response.json()["error"]["param"] is None
        assert response.json()["error"]["message"].startswith("the request body is")
    for key in (None, "wrong"):
        response = post(server, "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT}, key=key)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed
    missing = httpx.get(server.url + "/v1/nothing", headers={"Authorization": f"Bearer {API_KEY}"})
    assert missing.status_code == 404 and "error" in missing.json()


def _wait_for(server: ServerProcess, condition: Any, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if condition(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def test_a_client_that_leaves_frees_its_pages(client: openai.OpenAI, server: ServerProcess) -> None:
    """A streaming client, and one waiting for the whole answer, that go away: their requests are cancelled.
    (8 samples of 88 tokens take 96 pages of the 160 and 88 steps.)"""
    before = server.stats()["requests_cancelled"]
    stream = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=88, n=8, stream=True, extra_body={"ignore_eos": True}
    )
    for _ in range(3):
        next(iter(stream))
    assert server.stats()["pages_in_use"] > 0
    stream.close()
    stats = _wait_for(server, lambda s: s["requests_cancelled"] > before and s["pages_in_use"] == 0)
    assert stats["requests_cancelled"] == before + 1 and stats["pages_in_use"] == 0, stats
    assert stats["requests_in_flight"] == 0
    body = {"prompt": PROMPT, "max_tokens": 88, "n": 8, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            json={"model": MODEL_NAME, **body},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=httpx.Timeout(60, read=0.3),
        )
    stats = _wait_for(server, lambda s: s["requests_cancelled"] > before + 1 and s["pages_in_use"] == 0)
    assert stats["requests_cancelled"] == before + 2 and stats["pages_in_use"] == 0, stats


def test_n_is_capped_and_samples_that_could_never_fit_the_pool_are_refused(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    added = server.stats()["requests_added"]
    for prompt, n, max_tokens, says in (
        (PROMPT, MAX_N + 1, 4, f"n: {MAX_N + 1} samples exceed this server's limit of {MAX_N}"),
        (PROMPT, 16, 88, "n: 16 samples of up to 94 tokens need 192 KV pages at once, the pool has 160"),
        ([PROMPT, "how are you"], 9, 4, f"ask for 18 samples, more than this server's limit of {MAX_N}"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model=MODEL_NAME, prompt=prompt, n=n, max_tokens=max_tokens)
        assert raised.value.param == "n" and says in raised.value.message, raised.value.message
    assert server.stats()["requests_added"] == added  # refused before any of it ran


def test_a_maximal_request_does_not_keep_small_ones_waiting(server: ServerProcess) -> None:
    """The largest request the server takes (n = --max-n, as many tokens as the pool holds for them: 16
    samples of 74 tokens, 150 steps of the 8 rows) and, once the engine has it, three small requests beside
    it: each small one finishes in a small part of the time the big one still takes, and in a few times its
    own time alone (all measured here and now, so a loaded machine slows them alike). First come, first
    served, they would wait for the big one to finish."""
    small = dict(model=MODEL_NAME, max_tokens=2, temperature=0)
    prompts = ["how are you", "the one", "what is it"]

    async def seconds(client: openai.AsyncOpenAI, **request: Any) -> float:
        started = time.perf_counter()
        await client.completions.create(**request)
        return time.perf_counter() - started

    async def big(client: openai.AsyncOpenAI, started: asyncio.Event) -> float:
        stream = await client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            n=MAX_N,
            max_tokens=74,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for _ in stream:
            started.set()  # its first sample has drawn a token: the others follow it into the rows
        return time.perf_counter()

    async def main() -> tuple[list[float], float, list[float]]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300
        ) as client:
            alone = [await seconds(client, prompt=prompt, **small) for prompt in prompts * 2]
            for _ in range(4):  # the round counted is one that compiled nothing (the first compiles its
                # programs; under load, preempted samples recompute in chunks of other shapes, compiled later)
                compiled = programs(server.stats())
                started = asyncio.Event()
                whole = asyncio.ensure_future(big(client, started))
                await started.wait()
                sent = time.perf_counter()
                beside = await asyncio.gather(*[seconds(client, prompt=p, **small) for p in prompts])
                remaining = await whole - sent
                if programs(server.stats()) == compiled:
                    return alone[len(prompts) :], remaining, list(beside)
            raise AssertionError(f"every round of 4 compiled a program: {server.stats()}")

    alone, remaining, beside = asyncio.run(main())
    print(f"alone {alone} s, beside {beside} s, the big one's remaining time {remaining} s")
    assert max(beside) <= 0.5 * remaining, (beside, remaining)
    assert max(beside) <= 20 * np.median(alone), (beside, alone)


def _blocks(readme: Path) -> list[tuple[str, str]]:
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(readme.read_text())]


def _printed(code: str, name: str) -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, name, "exec"), {"__name__": "readme"})
    return output.getvalue()


def test_the_readme_python_blocks_run(server: ServerProcess) -> None:
    """The serve README's engine block prints its ```text block; its client block and the root README's
    run against the shared server (its URL, key and model name put in)."""
    blocks = _blocks(REPOSITORY / "packages" / "serve" / "README.md")
    python = [i for i, (kind, _) in enumerate(blocks) if kind == "python"]
    assert len(python) == 2, "the serve README has 2 python blocks: update this test with it"
    engine, client = python
    assert blocks[engine + 1][0] == "text"
    assert _printed(blocks[engine][1], "serve README block 1") == blocks[engine + 1][1]
    (root,) = [code for kind, code in _blocks(REPOSITORY / "README.md") if kind == "python"]
    for code, model in ((blocks[client][1], "hf-folder"), (root, "demo")):
        for old, new in (
            ("http://127.0.0.1:8000/v1", server.url + "/v1"),
            ('api_key="none"', f'api_key="{API_KEY}"'),
            (f'model="{model}"', f'model="{MODEL_NAME}"'),
        ):
            assert old in code, (old, code)
            code = code.replace(old, new)
        assert _printed(code, "README client block").strip()  # the model's words


def test_a_server_on_a_unix_socket_answers_as_on_a_port(
    client: openai.OpenAI, folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``--uds PATH`` (a machine that allows no TCP socket, such as the one-chip TPU v5e): the openai client,
    through an httpx transport on the socket, gets the TCP server's greedy text; Ctrl-C exits with code 0.
    (The shared server's pool: the same programs, which this server finds in the compilation cache.)"""
    socket = tmp_path_factory.mktemp("uds") / "server.sock"
    server = start_server(folder, socket.parent / "server.log", "--num-pages", "160", uds=socket)
    try:
        assert socket.is_socket() and "on unix socket" in server.output()
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)))
        local = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, http_client=http)
        assert [m.id for m in local.models.list().data] == [MODEL_NAME]
        answer = local.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
        on_port = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
        assert answer.choices[0].text == on_port.choices[0].text
    finally:
        assert server.stop() == 0, server.output()[-3000:]


@pytest.mark.parametrize(("tensor", "replicas"), [(2, 1), (1, 2)])
def test_tensor_parallel_and_replicas_answer_as_one_device(
    client: openai.OpenAI, folder: Path, tensor: int, replicas: int
) -> None:
    """--tensor 2 and --replicas 2 (in this process, on its simulated devices): the one-device server's
    greedy texts (deterministic mode: whichever replica runs a request); a split that does not divide, or
    more devices than there are, is refused naming the option."""
    from starlette.testclient import TestClient

    served = load_hf_folder(folder, name=MODEL_NAME)
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    config = engine_config_of(parser.parse_args(ENGINE_OPTIONS))  # the servers' options: 40 pages
    # every step in the program of the most tokens: deterministic mode gives the bits the row-checked smaller
    # programs give, and no row check compiles its probe programs (twice with replicas)
    config = dataclasses.replace(config, min_rows=config.step_budget()[1])
    app = create_app(served, config, tensor=tensor, replicas=replicas)
    prompts = [PROMPT, "how are you", "the one"]
    with TestClient(app) as local:
        assert gc.get_freeze_count() > 0, "the startup's objects are frozen out of the collector's scans"
        engine = app.state.server.driver.engine
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as clients:  # at once: both replicas busy
            answers = list(
                clients.map(
                    lambda p: local.post(
                        "/v1/completions",
                        json={"model": MODEL_NAME, "prompt": p, "max_tokens": 8, "temperature": 0},
                    ),
                    prompts,
                )
            )
        if replicas == 1:
            assert engine.runner.paged_kv.pool.keys.array.sharding.spec[2] == "tensor"  # kv heads split
        else:
            assert all(e.stats.requests_added >= 1 for e in engine.engines)  # the least busy takes each
        assert local.get("/stats").json()["pages_total"] == 40 * replicas
    assert gc.get_freeze_count() == 0, "a stopped server unfreezes them"
    for prompt, answer in zip(prompts, answers):
        alone = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0)
        assert answer.json()["choices"][0]["text"] == alone.choices[0].text
    for devices, copies, message in (
        (3, 1, "--tensor 3: heads=4 does not divide"),
        (64, 1, "there are 8"),
        (4, 4, "need 16 devices"),
    ):
        with pytest.raises(OptionError, match=message):
            build_engine(served, config, tensor=devices, replicas=copies)


def test_a_folder_is_served_in_the_dtype_it_is_stored_in_unless_asked(folder: Path, tmp_path: Path) -> None:
    """``--dtype auto`` (the default) keeps config.json's dtype: a bfloat16 checkpoint is held in bfloat16 (as
    vLLM does; float32 would take twice the memory and, on an accelerator, twice a decode step's reads)."""

    def dtypes(served: ServedModel) -> set[str]:
        return {
            str(leaf.dtype)
            for leaf in jax.tree.leaves(served.model)
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        }

    stored = tiny_hf_folder(tmp_path / "bf16", dtype="bfloat16")
    assert dtypes(load_hf_folder(stored)) == {"bfloat16"}
    assert dtypes(load_hf_folder(stored, dtype="float32")) == {"float32"}
    assert dtypes(load_hf_folder(folder)) == {"float32"}
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, got 'float16'"):
        load_hf_folder(stored, dtype="float16")
