"""Determinism soak: many requests at once through ``halyard serve --deterministic``, each compared with the
same request served alone (its text, finish reason, tokens and log-probs to the bit, every choice).

The workload, from ``--seed``: prompts of 1 to 64 words, half of them after one of a few shared prefixes (the
prefix cache), ``max_tokens`` 1 to 32, temperatures 0 to 1.3 with a seed per request and top-p on some,
``n`` of 1 to 3, stop strings on some, streamed or whole. The server's page pool is small enough that
sequences are preempted and recomputed. Each round sends every request with up to ``--concurrency`` in
flight, in a shuffled order, and some clients hang up (a stream closed after a chunk or three, a whole
request cancelled): a hang-up's text so far must begin the alone text. After each round every page must be
free. The alone answers come first, one request at a time (once: they are the reference of every round).
Requests go through the official ``openai`` client, as users send them.

This is a tool, not a benchmark: it reports mismatches, not speed. ``make stress`` runs it beside CPU hogs
(tools/stress_suite.sh); the CI runs a short form (tests/test_determinism_soak_smoke.py).

Usage::

    python tools/determinism_soak.py                         # 2,000 requests, 3 rounds, on a tiny model
    python tools/determinism_soak.py --requests 40 --rounds 1   # seconds, once compiled
    python tools/determinism_soak.py --hf FOLDER -- --num-pages 64   # another model; server options after --

Exit status: 0 when every answer equalled its alone answer and every round freed every page, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

WORDS = ["<unk>", "<|eot|>", *(f"w{i}" for i in range(2, 64))]
SERVER_OPTIONS = [
    "--deterministic", "--page-size", "8", "--num-pages", "40", "--max-context", "128", "--max-running", "8",
    "--chunk-size", "16", "--max-prefill-rows", "2", "--deterministic-rows", "4", "--max-n", "3",
]  # fmt: skip
"""Two programs of 4 rows when 8 run (steps of one program and of two alternate), 40 pages of 8 tokens for
up to 8 sequences of up to 128: the pool runs out and sequences are preempted."""
MODEL = "soak"
Answer = dict[int, tuple[str, str | None, list[str], list[float]]]
"""Per choice index: its text, finish reason, tokens and their log-probs."""


def write_model(folder: Path) -> Path:
    """A random tiny Llama (float32) as a Hugging Face folder with a word-level tokenizer of `WORDS`."""
    import jax
    from tokenizers import Tokenizer, models, pre_tokenizers

    from halyard.export import export_hf
    from halyard.models import init_model, model_config

    tokenizer_folder = folder.parent / f"{folder.name}-tokenizer"
    tokenizer_folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tokenizer_folder / "tokenizer.json"))
    settings = {"eos_token": WORDS[1], "unk_token": WORDS[0], "tokenizer_class": "PreTrainedTokenizerFast"}
    (tokenizer_folder / "tokenizer_config.json").write_text(json.dumps(settings))
    config = model_config(
        "llama", vocab_size=len(WORDS), hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
        num_kv_heads=2, max_position=128, initializer_range=0.3,
    )  # fmt: skip
    export_hf(init_model(config, jax.random.key(7)), folder, tokenizer=tokenizer_folder, eos_token_id=1)
    return folder


def requests(count: int, seed: int) -> list[dict[str, Any]]:
    """The workload (see the module docstring): ``count`` request bodies, each with ``stream`` set."""
    draw = random.Random(seed)
    prefixes = [[draw.choice(WORDS[2:]) for _ in range(draw.randint(8, 24))] for _ in range(4)]
    bodies = []
    for number in range(count):
        words = draw.choice(prefixes) if draw.random() < 0.5 else []
        words = words + [draw.choice(WORDS[2:]) for _ in range(draw.randint(1, 64 - len(words)))]
        body = {
            "model": MODEL,
            "prompt": " ".join(words),
            "max_tokens": draw.randint(1, 32),
            "temperature": draw.choice([0.0, 0.7, 1.0, 1.3]),
            "seed": seed * 100_000 + number,
            "n": draw.choice([1, 1, 1, 2, 3]),
            "logprobs": 0,
            "stream": draw.random() < 0.6,
        }
        if draw.random() < 0.3:
            body["top_p"] = 0.9
        if draw.random() < 0.3:
            body["stop"] = [draw.choice(WORDS[2:]), " ".join(draw.sample(WORDS[2:], 2))]
        bodies.append(body)
    return bodies


async def answer(client: openai.AsyncOpenAI, body: dict[str, Any], hang_up_after: int = 0) -> Answer:
    """What the server answers ``body`` (each choice's text, finish, tokens and log-probs); a stream is
    closed after ``hang_up_after`` chunks when that is not 0."""
    choices: Answer = {}
    if not body["stream"]:
        whole = await client.completions.create(**body)
        for choice in whole.choices:
            assert choice.logprobs is not None
            logprobs = choice.logprobs
            choices[choice.index] = (
                choice.text,
                choice.finish_reason,
                logprobs.tokens,
                logprobs.token_logprobs,
            )  # type: ignore[assignment]
        return choices
    stream = await client.completions.create(**body)
    chunks = 0
    async for chunk in stream:
        for choice in chunk.choices:
            text, finish, tokens, logprobs = choices.get(choice.index, ("", None, [], []))
            if choice.logprobs is not None:
                tokens, logprobs = tokens + choice.logprobs.tokens, logprobs + choice.logprobs.token_logprobs  # type: ignore[operator]
            choices[choice.index] = (text + choice.text, choice.finish_reason or finish, tokens, logprobs)
        chunks += 1
        if chunks == hang_up_after:
            await stream.close()
            break
    return choices


def compare(number: int, loaded: Answer, alone: Answer, hung_up: bool) -> list[str]:
    """The mismatches of request ``number``, one a choice (a hung-up answer: each choice's text so far must
    begin the alone one's)."""
    if hung_up:
        return [
            f"request {number} choice {index} (hung up): {text!r} does not begin {alone[index][0]!r}"
            for index, (text, *_) in loaded.items()
            if not alone[index][0].startswith(text)
        ]
    lines = []
    for index in sorted(set(loaded) | set(alone)):
        among, single = loaded.get(index), alone.get(index)
        if among != single:
            lines.append(
                f"request {number} choice {index}: {_shown(among)} among others, {_shown(single)} alone"
            )
    return lines


def _shown(choice: tuple[str, str | None, list[str], list[float]] | None) -> str:
    """A choice in a line: its text, finish reason, tokens and log-probs."""
    if choice is None:
        return "no choice"
    text, finish, tokens, logprobs = choice
    return f"{text!r} ({finish}; tokens {tokens}; log-probs {logprobs})"


async def soak_round(
    client: openai.AsyncOpenAI, bodies: list[dict[str, Any]], alone: list[Answer], seed: int, concurrency: int
) -> list[str]:
    """One round (see the module docstring); returns the mismatches."""
    draw = random.Random(seed)
    order = draw.sample(range(len(bodies)), len(bodies))
    hang_ups = {n: draw.randint(1, 3) for n in order if draw.random() < 0.1}
    gate = asyncio.Semaphore(concurrency)

    async def one(number: int) -> list[str]:
        async with gate:
            await asyncio.sleep(draw.random() * 0.01)
            body = bodies[number]
            if number in hang_ups and not body["stream"]:
                task = asyncio.ensure_future(answer(client, body))
                await asyncio.sleep(hang_ups[number] * 0.02)
                if not task.done():
                    task.cancel()
                    return []  # cancelled: the client saw nothing
                return compare(number, task.result(), alone[number], False)
            try:
                loaded = await answer(client, body, hang_ups.get(number, 0))
            except openai.APIError as error:  # a 503 when the engine failed: every later request gets one
                return [f"request {number}: {type(error).__name__}: {error}"]
            return compare(number, loaded, alone[number], number in hang_ups)

    results = await asyncio.gather(*[one(n) for n in order])
    return [line for lines in results for line in lines]


def start_server(folder: Path, options: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """``halyard serve --hf folder`` on a free port, once it answers /health."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        str(Path(sys.executable).parent / "halyard"),
        "serve",
        "--hf",
        str(folder),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(
        [*command, "--model-name", MODEL, *SERVER_OPTIONS, *options],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}; its log: {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise TimeoutError(f"the server did not answer /health in 600 s; its log: {log}")


def settled_stats(url: str, timeout: float = 60) -> dict[str, float]:
    """The server's /stats once no request is in flight (or after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(url + "/stats", timeout=10).json()
        if (stats["requests_in_flight"] == 0 and stats["pages_in_use"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


async def soak(url: str, args: argparse.Namespace) -> int:
    """Every round against the server at ``url``; prints a line a round, returns the mismatches in all."""
    bodies = requests(args.requests, args.seed)
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="none", timeout=900,  # the client's retries, as users run it
        http_client=httpx.AsyncClient(limits=limits),
    ) as client:  # fmt: skip
        started = time.perf_counter()
        alone = [await answer(client, dict(body, stream=False)) for body in bodies]
        print(f"{len(bodies)} requests alone: {time.perf_counter() - started:.0f} s", flush=True)
        failures = 0
        for round_number in range(1, args.rounds + 1):
            before = settled_stats(url)
            started = time.perf_counter()
            mismatches = await soak_round(client, bodies, alone, args.seed + round_number, args.concurrency)
            stats = settled_stats(url)
            leaked = stats["pages_in_use"] != 0
            preempted = stats["preemptions"] - before["preemptions"]
            print(
                f"round {round_number}: {len(bodies)} requests, {len(mismatches)} mismatches, "
                f"{preempted:.0f} preemptions, pages in use after: {stats['pages_in_use']:.0f}, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
            for line in mismatches[:10]:
                print("    " + line, flush=True)
            failures += len(mismatches) + leaked
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests a round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at once (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="the workload's and the rounds' seed")
    parser.add_argument(
        "--hf", type=Path, help="a Hugging Face folder to serve (default: a tiny random Llama)"
    )
    parser.add_argument("--log", type=Path, help="the server's log (default: in a temporary folder)")
    parser.add_argument("server_options", nargs="*", help="more `halyard serve` options, after --")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="determinism-soak-") as work:
        folder = args.hf or write_model(Path(work) / "model")
        log = args.log or Path(work) / "server.log"
        process, url = start_server(folder, args.server_options, log)
        try:
            failures = asyncio.run(soak(url, args))
        finally:
            process.terminate()
            process.wait(60)
    print("determinism soak: " + ("pass" if failures == 0 else f"FAIL ({failures} mismatches or leaks)"))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
