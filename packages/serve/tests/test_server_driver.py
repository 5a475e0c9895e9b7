"""`AsyncEngine` with a scripted engine (no JAX): only its thread ever calls the engine, every update reaches
its own request's queue, a cancelled request gets nothing more, and draining, stopping or a failing engine
answer every waiting caller instead of leaving it hanging; and the engine options the commands parse."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import threading
import time
from typing import Any

import jax.numpy as jnp
import pytest

from halyard.serve import EngineStats, ParameterError, SamplingParams, Update
from halyard.serve.server import AsyncEngine, EngineUnavailable, add_server_arguments, engine_config_of


class ScriptedEngine:
    """Each request yields one token per step until ``max_tokens``; it records which threads called it."""

    def __init__(self, fail_at_step: int | None = None):
        self.threads: set[int] = set()
        self.requests: dict[str, list[int]] = {}
        self.limits: dict[str, tuple[int, int]] = {}
        self.pending: list[Update] = []
        self.stats = EngineStats(pages_total=8)
        self.fail_at_step = fail_at_step
        self.cancelled: list[str] = []

    def _called(self) -> None:
        self.threads.add(threading.get_ident())

    def hand_off_text(self) -> None:
        return None  # no tokenizer: its updates' text is passed on as it is

    def stop_sample(self, request_id: str, index: int, stop_string: str) -> None:
        self._called()

    def add_request(
        self, prompt: list[int], params: SamplingParams, request_id: str, *, caller: object = None
    ) -> str:
        self._called()
        if len(prompt) > 5:
            raise ParameterError("prompt", "prompt: longer than 5 tokens")
        self.requests[request_id] = []
        self.limits[request_id] = (params.max_tokens, params.n)
        return request_id

    def cancel(self, request_id: str) -> None:
        self._called()
        if self.requests.pop(request_id, None) is not None:
            self.cancelled.append(request_id)

    @property
    def has_work(self) -> bool:
        self._called()
        return bool(self.requests) or bool(self.pending)

    def step(self) -> list[Update]:
        self._called()
        self.stats.steps += 1
        if self.fail_at_step is not None and self.stats.steps >= self.fail_at_step:
            raise RuntimeError("a bug in a step")
        updates, self.pending = self.pending, []
        for request_id, tokens in list(self.requests.items()):
            limit, n = self.limits[request_id]
            tokens.append(len(tokens))
            done = len(tokens) >= limit
            for index in range(n):
                reason = "length" if done else None
                updates.append(Update(request_id, index, [tokens[-1]], "x", [0.0], [0.0], [[]], reason))
            if done:
                del self.requests[request_id]
        return updates


async def _collect(updates: asyncio.Queue, samples: int) -> list[Any]:
    got: list[Any] = []
    finished = 0
    while finished < samples:
        item = await asyncio.wait_for(updates.get(), 10)
        got.append(item)
        if isinstance(item, BaseException):
            return got
        finished += item.finish_reason is not None
    return got


def test_updates_reach_their_request_and_only_the_engine_thread_calls_the_engine() -> None:
    engine = ScriptedEngine()
    driver = AsyncEngine(engine)  # type: ignore[arg-type]
    driver.start()

    async def main() -> None:
        queues = [asyncio.Queue() for _ in range(20)]
        ids = await asyncio.gather(
            *[
                driver.submit([1, 2], SamplingParams(max_tokens=3 + i % 4, n=1 + i % 3), q)
                for i, q in enumerate(queues)
            ]
        )
        results = await asyncio.gather(*[_collect(q, 1 + i % 3) for i, q in enumerate(queues)])
        for i, (request_id, got) in enumerate(zip(ids, results)):
            assert {u.request_id for u in got} == {request_id}
            assert len(got) == (3 + i % 4) * (1 + i % 3)
        with pytest.raises(ParameterError):
            await driver.submit([1] * 6, SamplingParams(), asyncio.Queue())

    asyncio.run(main())
    driver.stop()
    assert len(engine.threads) == 1 and threading.get_ident() not in engine.threads
    assert not driver.running and driver.stats["requests_in_flight"] == 0


def test_a_cancelled_request_gets_no_more_updates() -> None:
    engine = ScriptedEngine()
    driver = AsyncEngine(engine)  # type: ignore[arg-type]
    driver.start()

    async def main() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        request_id = await driver.submit([1], SamplingParams(max_tokens=10**9), updates)
        await updates.get()
        driver.cancel(request_id)
        await asyncio.sleep(0.2)
        while not updates.empty():  # what was delivered before the cancel arrived
            updates.get_nowait()
        await asyncio.sleep(0.2)
        assert updates.empty() and engine.cancelled == [request_id]

    asyncio.run(main())
    driver.stop()


def test_draining_ends_running_requests_and_refuses_new_ones() -> None:
    engine = ScriptedEngine()
    driver = AsyncEngine(engine)  # type: ignore[arg-type]
    driver.start()

    async def main() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        await driver.submit([1], SamplingParams(max_tokens=10**9), updates)
        quick: asyncio.Queue = asyncio.Queue()
        await driver.submit([1], SamplingParams(max_tokens=2), quick)
        driver.drain(0.3)
        with pytest.raises(EngineUnavailable, match="shutting down"):
            await driver.submit([1], SamplingParams(), asyncio.Queue())
        assert [u.finish_reason for u in await _collect(quick, 1)] == [None, "length"]  # finished in time
        got = await _collect(updates, 1)
        assert isinstance(got[-1], EngineUnavailable)

    asyncio.run(main())
    assert driver.running  # draining ends requests, not the thread: stop does
    driver.stop()
    assert not driver.running


def test_a_failing_engine_answers_every_caller() -> None:
    engine = ScriptedEngine(fail_at_step=3)
    driver = AsyncEngine(engine)  # type: ignore[arg-type]
    driver.start()

    async def main() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        await driver.submit([1], SamplingParams(max_tokens=100), updates)
        got = await _collect(updates, 1)
        assert isinstance(got[-1], EngineUnavailable) and "a bug in a step" in str(got[-1])
        with pytest.raises(EngineUnavailable, match="the engine failed"):
            await driver.submit([1], SamplingParams(), asyncio.Queue())

    asyncio.run(main())
    # the thread ends by itself, after answering the callers (so it may still be finishing up here)
    deadline = time.monotonic() + 120  # a hang guard, room for a loaded machine
    while driver.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not driver.running and isinstance(driver.failure, RuntimeError)
    driver.stop()


def test_training_arithmetic_option_implies_deterministic_and_says_when_xla_started_too_early(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--training-arithmetic`` (halyard-serve and halyard serve): deterministic mode with the trainer's
    arithmetic; in a process whose XLA already runs with fused multiply-adds it says so (the suite's processes
    run without: here XLA_FLAGS reads as a user's who did not ask, after XLA started)."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    plain = engine_config_of(parser.parse_args([]))
    assert not plain.deterministic and not plain.training_arithmetic
    jnp.zeros(1).block_until_ready()  # XLA has started in this process
    with caplog.at_level("WARNING", logger="halyard.serve.server"):
        config = engine_config_of(parser.parse_args(["--training-arithmetic"]))
    assert config.deterministic and config.training_arithmetic
    assert "log-probs agree with the trainer's to rounding only" in caplog.text
    with pytest.raises(ValueError, match="training_arithmetic needs deterministic=True"):
        dataclasses.replace(plain, training_arithmetic=True)
