"""Deterministic mode: a request's tokens and log-probs are bitwise the same alone or inside batches of 1
to 64 random other requests, in shuffled arrival orders, with other prefill chunk sizes, with its prompt's
pages from the prefix cache, and when it is preempted and recomputed. Against the training forward pass
traced inside `batch_invariant` (the model over the whole sequence, as `trainer.objective: grpo` computes
it) the log-probs are bitwise equal in a process without fused multiply-adds (what ``train`` starts), and
agree to float32 rounding otherwise and against the plain forward pass; the test states the bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from deterministic_case import (
    TARGET,
    TARGET_PROMPT,
    VOCAB,
    config,
    model,
    others_ending_with_the_target,
)
from tiny_models import forward_logprobs, logprob_tolerance, tiny_model

from halyard.serve import Engine, EngineConfig, SampleOutput, SamplingParams

PLAIN_FORWARD_BOUND = 2e-4
"""The largest |engine - plain training forward| log-prob accepted (measured at this width: 8.5e-5)."""


@pytest.fixture(scope="module")
def engines() -> dict[int, Engine]:
    """Deterministic engines by chunk size, built when a test first asks (not when a worker collects the file:
    each of the suite's worker processes collects every file)."""
    # Chunks of 128 two at a time: programs of the chunk-64 engine's sizes (32 rows and 256 prefill tokens),
    # compiled once for both.
    return {64: Engine(model(), config(64)), 128: Engine(model(), config(128, prefill_rows=2))}


def _others(count: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    return [
        (
            [int(t) for t in rng.integers(0, VOCAB, int(rng.integers(1, 150)))],
            SamplingParams(
                max_tokens=int(rng.integers(1, 60)),
                temperature=float(rng.uniform(0, 1.5)),
                top_k=int(rng.integers(0, 50)),
            ),
        )
        for _ in range(count)
    ]


def _run(
    engine: Engine,
    others: list[tuple[list[int], SamplingParams]],
    position: int,
    cold: bool = True,
    held: int = 0,
) -> SampleOutput:
    """The target's sample among ``others`` at ``position`` (from a cold prefix cache with ``cold``); the
    requests' pages are freed after (``held``: pages owned outside the engine's requests)."""
    if cold:
        engine.pages.clear_cache()
    requests = list(others)
    requests.insert(position, (TARGET_PROMPT, TARGET))
    outputs = engine.generate([prompt for prompt, _ in requests], [params for _, params in requests])
    assert engine.pages.in_use == held
    return outputs[position].samples[0]


@pytest.fixture(scope="module")
def alone(engines: dict[int, Engine]) -> SampleOutput:
    """The target request's sample alone in the chunk-64 engine: what every other run must equal."""
    return _run(engines[64], [], 0)


def _assert_bitwise(sample: SampleOutput, alone: SampleOutput) -> None:
    assert sample.token_ids == alone.token_ids
    assert np.array_equal(np.float32(sample.logprobs), np.float32(alone.logprobs))
    assert np.array_equal(np.float32(sample.sampled_logprobs), np.float32(alone.sampled_logprobs))


@pytest.mark.parametrize(("count", "chunk_size"), [(1, 64), (7, 128), (20, 64), (63, 128), (64, 64)])
def test_bitwise_among_other_requests_in_any_arrival_order(
    count: int, chunk_size: int, engines: dict[int, Engine], alone: SampleOutput
) -> None:
    others = _others(count, seed=count)
    position = int(np.random.default_rng(count).integers(0, count + 1))
    stats = engines[chunk_size].stats
    pipelined = stats.steps_pipelined
    _assert_bitwise(_run(engines[chunk_size], others, position), alone)
    # steps of one program were dispatched before the step before them was fetched (their tokens fed on
    # the device); with more than 32 sequences running, a step runs several programs and fetches its own
    assert stats.steps_pipelined > pipelined


def test_bitwise_with_the_prompt_from_the_prefix_cache(
    engines: dict[int, Engine], alone: SampleOutput
) -> None:
    engine = engines[64]
    engine.pages.clear_cache()
    engine.generate([TARGET_PROMPT[:90] + [7] * 20], SamplingParams(max_tokens=1))  # caches the first page
    assert engine.pages.cached_prefix(TARGET_PROMPT)
    _assert_bitwise(_run(engine, _others(5, seed=99), 3, cold=False), alone)


def test_bitwise_when_preempted_and_recomputed(engines: dict[int, Engine], alone: SampleOutput) -> None:
    """The requests get 6 of the pool's pages, as in a pool of 6 (an owner outside the scheduler holds the
    rest): the engine's programs are those of the other tests (a pool of another size compiles its own)."""
    engine = engines[64]
    engine.pages.clear_cache()
    engine.pages.add("held")
    engine.pages.reserve("held", (engine.pages.available - 6) * engine.pages.page_size)
    before = engine.stats.preemptions
    try:
        _assert_bitwise(_run(engine, _others(6, seed=5), 4, held=engine.pages.in_use), alone)
    finally:
        engine.pages.release("held")
    assert engine.stats.preemptions > before


def test_the_training_forward_agrees_within_the_stated_bound(alone: SampleOutput) -> None:
    sequence = TARGET_PROMPT + alone.token_ids
    padded = sequence + [0] * (192 - len(sequence))  # a whole number of the kernel's 64-token blocks
    rows = forward_logprobs(model(), padded)
    training = [rows[len(TARGET_PROMPT) - 1 + i, token] for i, token in enumerate(alone.token_ids)]
    assert np.abs(np.float32(training) - np.float32(alone.logprobs)).max() <= PLAIN_FORWARD_BOUND


def test_training_arithmetic_equals_the_training_forward_without_fused_multiply_adds() -> None:
    """`EngineConfig.training_arithmetic`, in a process of its own (XLA reads the setting once, when it starts;
    and the suite's processes compile at -O0): decoding programs of 32 and 64 rows, and the request among 20
    others. With fused multiply-adds (the script without `unfuse_multiply_add`) the 32-row engine's
    difference measured 1.8e-5 (its 1-token program then disagreed with the full one)."""
    script = Path(__file__).with_name("training_forward_check.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=script.parent,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"unfused": True, "differences": {"32": 0.0, "64": 0.0}, "among_others_bitwise": True}


def test_fast_mode_agrees_to_rounding_but_not_bitwise(
    engines: dict[int, Engine], alone: SampleOutput
) -> None:
    """Outside deterministic mode a request alone and the same request among others agree to rounding, and
    differ in their last bits: XLA rounds them differently at this model's width, so the bitwise tests above
    test something (if this fails because they became equal, widen `model`)."""
    fast = Engine(
        model(),
        EngineConfig(
            page_size=64, num_pages=160, max_context=256, max_running=64, chunk_size=64, max_prefill_rows=1
        ),  # programs of at most 64 + 64 tokens: fewer token buckets to compile than with 4 prefill rows
    )
    (output,) = fast.generate([TARGET_PROMPT], TARGET)
    fast_alone = output.samples[0]
    assert fast_alone.token_ids == alone.token_ids
    # another program's sums over the same sequence (tiny_models.logprob_tolerance)
    bound = logprob_tolerance(model(), [TARGET_PROMPT + list(alone.token_ids)])
    np.testing.assert_allclose(fast_alone.logprobs, alone.logprobs, atol=bound, rtol=0)
    assert min(shape.tokens for shape in fast.runner.compiled_shapes) == 1  # alone: one token a step
    among = _run(fast, others_ending_with_the_target(seed=20), 7)
    np.testing.assert_allclose(among.logprobs[:5], fast_alone.logprobs[:5], atol=bound, rtol=0)
    assert not np.array_equal(np.float32(among.logprobs[:5]), np.float32(fast_alone.logprobs[:5]))
    # deterministic: programs of at most deterministic_rows sequences, each of one of the fast mode's token
    # buckets (batch-invariant programs: none is compiled only to probe another)
    runner = engines[64].runner
    shapes = runner.compiled_shapes
    assert max(s.seqs for s in shapes) == 32
    assert {s.tokens for s in shapes} <= {*runner.token_sizes, runner.max_tokens}


def test_by_default_a_step_of_every_running_row_is_one_pipelined_program() -> None:
    """``deterministic_rows`` None (the default): a step is one program of up to ``max_running`` sequences (34
    here, more than the old default of 32), so deterministic steps are pipelined as the fast mode's are, and a
    request alone and among others gets the same bits."""
    assert EngineConfig(deterministic=True, max_running=40).step_budget()[0] == 40
    assert EngineConfig(deterministic=True, max_running=40, deterministic_rows=4).step_budget()[0] == 4
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="deterministic_rows must be a positive int or None"):
            EngineConfig(deterministic_rows=bad)  # type: ignore[arg-type]
    engine = Engine(
        tiny_model("llama"),
        EngineConfig(
            page_size=8, num_pages=80, max_context=32, max_running=34, chunk_size=8, deterministic=True
        ),
    )
    target = SamplingParams(max_tokens=12, temperature=1.0, seed=7, logprobs=True)
    (alone,) = engine.generate([[5, 9, 2, 7, 1]], target)
    others = SamplingParams(max_tokens=10, temperature=0.8, seed=3)
    prompts = [[5, 9, 2, 7, 1], *([3 + i % 50, 1, 4] for i in range(33))]
    steps, pipelined = engine.stats.steps, engine.stats.steps_pipelined
    outputs = engine.generate(prompts, [target] + [others] * 33)
    assert engine.stats.steps_pipelined - pipelined == engine.stats.steps - steps - 1  # all but the first
    _assert_bitwise(outputs[0].samples[0], alone.samples[0])
