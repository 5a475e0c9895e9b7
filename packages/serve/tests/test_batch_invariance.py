"""Deterministic mode is batch-invariant by construction (`halyard.serve.runner`): every step program of a
deterministic engine gives a sequence the bits the program of the most tokens gives it, whatever else the
program holds and wherever the sequence sits (`halyard.serve.row_check`'s probes, over the program sizes of
the fast mode: nothing is probed when an engine starts), in float32 and bfloat16; a prompt's bits do not
depend on where its prefill chunks end; and a deterministic engine has the fast one's step shapes. Preemption,
prefix-cache hits and other requests beside a request: test_deterministic.py."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from deterministic_case import TARGET, VOCAB, model
from test_deterministic_bfloat16 import model as bfloat16_model

from halyard.serve import Engine, EngineConfig, SampleOutput
from halyard.serve.row_check import rows_agree
from halyard.serve.runner import ModelRunner

SMALL = EngineConfig(
    page_size=16, num_pages=64, max_context=64, max_running=8, chunk_size=16, max_prefill_rows=2,
    deterministic=True,
)  # fmt: skip
"""Programs of 1 to 40 tokens (8 decoding rows beside 2 chunks of 16): below and above one attention group
(16 rows) and one product block (32 rows)."""
PAGES = 4
"""Page bucket of the probed programs: sequences of up to the whole context."""


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(model(), SMALL)


@pytest.fixture(scope="module")
def bfloat16_runner() -> ModelRunner:
    return Engine(bfloat16_model(), SMALL).runner


@pytest.mark.parametrize("tokens", [1, 4, 16, 32])
def test_every_smaller_program_gives_each_sequence_the_full_programs_bits(
    engine: Engine, tokens: int
) -> None:
    runner = engine.runner
    shape = runner.shape_for(tokens, PAGES)
    assert shape.tokens == tokens  # the fast mode's program size: no probe chose it
    assert rows_agree(runner, shape)


def test_the_probes_see_the_fast_modes_rounding() -> None:
    """The same probes reject the fast mode's 1-token program (XLA rounds its rows otherwise): the test above
    can fail."""
    fast = Engine(model(), dataclasses.replace(SMALL, deterministic=False)).runner
    assert not rows_agree(fast, fast.shape_for(1, PAGES))


@pytest.mark.parametrize("tokens", [1, 8])
def test_bfloat16_programs_agree_over_probe_rows_sequences(bfloat16_runner: ModelRunner, tokens: int) -> None:
    """In bfloat16 the rounding hides another summation order in most rows: the probes compare 32 sequences
    (`halyard.serve.row_check.PROBE_ROWS`)."""
    assert rows_agree(bfloat16_runner, bfloat16_runner.shape_for(tokens, PAGES))


def _target(engine: Engine) -> SampleOutput:
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, VOCAB, 50)]
    params = dataclasses.replace(TARGET, max_tokens=12)
    (output,) = engine.generate([prompt], params)
    return output.samples[0]


def test_a_prompt_gets_the_same_bits_wherever_its_chunks_end(engine: Engine) -> None:
    """Chunks of 16 feed the 50-token prompt in whole attention blocks of 16 positions; chunks of 24 leave
    positions 16-31 and 48-49 as single-token rows (the kernel's other path) in programs of other sizes."""
    ragged = Engine(model(), dataclasses.replace(SMALL, chunk_size=24, max_prefill_rows=1))
    first, second = _target(engine), _target(ragged)
    assert first.token_ids == second.token_ids
    assert np.float32(first.logprobs).tobytes() == np.float32(second.logprobs).tobytes()
    assert np.float32(first.sampled_logprobs).tobytes() == np.float32(second.sampled_logprobs).tobytes()


def test_a_deterministic_engine_has_the_fast_engines_step_shapes() -> None:
    fast = Engine(model(), dataclasses.replace(SMALL, deterministic=False)).runner
    deterministic = Engine(model(), SMALL).runner
    for logprob_variants in (False, True):
        assert deterministic.shape_set(logprob_variants=logprob_variants) == fast.shape_set(
            logprob_variants=logprob_variants
        )
    assert [deterministic.shape_for(tokens, 3).tokens for tokens in (1, 3, 17, 33)] == [1, 4, 32, 40]


@pytest.mark.tpu
def test_on_the_chip_every_program_size_agrees_and_chunks_do_not_matter() -> None:
    """On a TPU (`make pytest` there runs the ``tpu`` tests): the probes over every program size of the
    bfloat16 engine, and the prompt in chunks of 16 and of 24."""
    engine = Engine(bfloat16_model(), SMALL)
    runner = engine.runner
    assert jax.default_backend() == "tpu"
    disagree = [t for t in runner.token_sizes[:-1] if not rows_agree(runner, runner.shape_for(t, PAGES))]
    assert not disagree
    ragged = Engine(bfloat16_model(), dataclasses.replace(SMALL, chunk_size=24, max_prefill_rows=1))
    first, second = _target(engine), _target(ragged)
    assert first.token_ids == second.token_ids
    assert np.float32(first.logprobs).tobytes() == np.float32(second.logprobs).tobytes()
