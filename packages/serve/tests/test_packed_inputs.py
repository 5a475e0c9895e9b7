"""`halyard.serve.packed_inputs`: a step's host inputs go to the device as one buffer and come back inside the
program bit for bit; a steady pipelined decode step sends one array; inputs that do not match a program's
packing are refused."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from tiny_models import tiny_model

from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.packed_inputs import pack, unpack
from halyard.serve.program import ProgramShape, example_inputs
from halyard.serve.runner import ModelRunner


def _random_inputs(seed: int):  # type: ignore[no-untyped-def]
    """Every array of a program's inputs filled with random bits of its dtype (negative ints, NaNs and all)."""
    rng = np.random.default_rng(seed)
    inputs = example_inputs(ProgramShape(tokens=16, seqs=4, seq_pages=3, prompt_logprobs=True))
    inputs = inputs._replace(fed_from=np.zeros((16,), np.int32))

    def randomised(leaf: np.ndarray) -> np.ndarray:
        bits = rng.integers(0, 2**32, size=leaf.shape, dtype=np.uint64).astype(np.uint32)
        return bits.view(leaf.dtype)

    return jax.tree.map(randomised, inputs)._replace(previous=np.arange(4, dtype=np.int32))


def test_every_input_comes_back_bit_for_bit_inside_the_program() -> None:
    inputs = _random_inputs(0)
    buffer, previous, packing = pack(inputs)
    assert buffer.dtype == np.int32 and buffer.ndim == 1
    unpacked = jax.jit(functools.partial(unpack, packing=packing))(buffer, previous)
    got, want = jax.tree.leaves(unpacked), jax.tree.leaves(inputs)
    assert len(got) == len(want) == len(packing.arrays) + 1
    for got_leaf, want_leaf in zip(got, want, strict=True):
        assert got_leaf.dtype == want_leaf.dtype and got_leaf.shape == want_leaf.shape
        np.testing.assert_array_equal(np.asarray(got_leaf).view(np.uint32), want_leaf.view(np.uint32))


def test_an_input_of_another_item_size_is_refused() -> None:
    inputs = _random_inputs(1)
    with pytest.raises(ValueError, match="a step input of dtype int64 does not pack into int32"):
        pack(inputs._replace(last=inputs.last.astype(np.int64)))


def test_a_steady_decode_step_sends_one_array_and_a_mismatched_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine(
        tiny_model("llama"), EngineConfig(page_size=8, num_pages=16, max_context=64, max_running=2)
    )
    sent: list[type] = []
    placed = ModelRunner._placed

    def counting(runner: ModelRunner, value):  # type: ignore[no-untyped-def]
        sent.append(type(value))
        return placed(runner, value)

    monkeypatch.setattr(ModelRunner, "_placed", counting)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request([5, 9, 2], params)
    engine.add_request([3, 1], params)
    for _ in range(3):  # the prefill, then decode steps fed by the program before
        engine.step()
    sent.clear()
    engine.step()
    assert engine.stats.steps_pipelined > 0
    assert sent.count(np.ndarray) == 1, sent  # the packed buffer; the drawn tokens stay on the device
    shape = engine.runner.compiled_shapes[0]
    wrong = engine.runner.example_inputs(shape)
    with pytest.raises(ValueError, match="do not match the arrays"):
        engine.runner.run(shape, wrong._replace(tokens=wrong.tokens.astype(np.float32)))
