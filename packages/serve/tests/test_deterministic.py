"""Deterministic mode: a request's tokens and log-probs are bitwise the same alone or inside batches of 1
to 64 random other requests, in shuffled arrival orders, with other prefill chunk sizes, with its prompt's
pages from the prefix cache, and when it is preempted and recomputed. Against the training forward pass
(the model over the whole sequence) the log-probs agree to float32 rounding: XLA's CPU kernels round a row
differently in a program of another shape, and the test states the bound."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import forward_logprobs, tiny_model

from halyard.serve import Engine, EngineConfig, SampleOutput, SamplingParams

MODEL = tiny_model(
    "llama", hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=256
)
TARGET_PROMPT = [int(t) for t in np.random.default_rng(0).integers(0, 256, 100)]
TARGET = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, logprobs=True)
TRAINING_FORWARD_BOUND = 1e-5
"""The largest |engine - training forward| log-prob accepted (measured: about 2e-6)."""


def _config(chunk_size: int, num_pages: int = 160) -> EngineConfig:
    return EngineConfig(
        page_size=64, num_pages=num_pages, max_context=256, max_running=64, chunk_size=chunk_size,
        max_prefill_rows=4, deterministic=True,
    )  # fmt: skip


ENGINES = {64: Engine(MODEL, _config(64)), 128: Engine(MODEL, _config(128))}
SMALL_POOL = Engine(MODEL, _config(64, num_pages=6))


def _others(count: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    return [
        (
            [int(t) for t in rng.integers(0, 256, int(rng.integers(1, 150)))],
            SamplingParams(
                max_tokens=int(rng.integers(1, 60)),
                temperature=float(rng.uniform(0, 1.5)),
                top_k=int(rng.integers(0, 50)),
            ),
        )
        for _ in range(count)
    ]


def _run(
    engine: Engine, others: list[tuple[list[int], SamplingParams]], position: int, cold: bool = True
) -> SampleOutput:
    if cold:
        engine.pages.clear_cache()
    requests = list(others)
    requests.insert(position, (TARGET_PROMPT, TARGET))
    outputs = engine.generate([prompt for prompt, _ in requests], [params for _, params in requests])
    assert engine.pages.in_use == 0
    return outputs[position].samples[0]


ALONE = _run(ENGINES[64], [], 0)


def _assert_bitwise(sample: SampleOutput) -> None:
    assert sample.token_ids == ALONE.token_ids
    assert np.array_equal(np.float32(sample.logprobs), np.float32(ALONE.logprobs))
    assert np.array_equal(np.float32(sample.sampled_logprobs), np.float32(ALONE.sampled_logprobs))


@pytest.mark.parametrize(("count", "chunk_size"), [(1, 64), (7, 128), (20, 64), (63, 128), (64, 64)])
def test_bitwise_among_other_requests_in_any_arrival_order(count: int, chunk_size: int) -> None:
    others = _others(count, seed=count)
    position = int(np.random.default_rng(count).integers(0, count + 1))
    _assert_bitwise(_run(ENGINES[chunk_size], others, position))


def test_bitwise_with_the_prompt_from_the_prefix_cache() -> None:
    engine = ENGINES[64]
    engine.pages.clear_cache()
    engine.generate([TARGET_PROMPT[:90] + [7] * 20], SamplingParams(max_tokens=1))  # caches the first page
    assert engine.pages.cached_prefix(TARGET_PROMPT)
    _assert_bitwise(_run(engine, _others(5, seed=99), 3, cold=False))


def test_bitwise_when_preempted_and_recomputed() -> None:
    engine = SMALL_POOL
    before = engine.stats.preemptions
    _assert_bitwise(_run(engine, _others(6, seed=5), 4))
    assert engine.stats.preemptions > before


def test_the_training_forward_agrees_within_the_stated_bound() -> None:
    sequence = TARGET_PROMPT + ALONE.token_ids
    padded = sequence + [0] * (192 - len(sequence))  # a whole number of the kernel's 64-token blocks
    rows = forward_logprobs(MODEL, padded)
    training = [rows[len(TARGET_PROMPT) - 1 + i, token] for i, token in enumerate(ALONE.token_ids)]
    difference = np.abs(np.float32(training) - np.float32(ALONE.logprobs)).max()
    assert difference <= TRAINING_FORWARD_BOUND


def test_fast_mode_agrees_to_rounding_and_compiles_only_the_shapes_it_needs() -> None:
    fast = Engine(
        MODEL,
        EngineConfig(
            page_size=64, num_pages=64, max_context=256, max_running=64, chunk_size=64, max_prefill_rows=4
        ),
    )
    (output,) = fast.generate([TARGET_PROMPT], TARGET)
    sample = output.samples[0]
    assert sample.token_ids == ALONE.token_ids
    np.testing.assert_allclose(sample.logprobs, ALONE.logprobs, rtol=2e-5, atol=2e-5)
    assert {shape.rows for shape in fast.runner.compiled_shapes} == {1}
    assert {shape.rows for shape in ENGINES[64].runner.compiled_shapes} == {4, 64}
