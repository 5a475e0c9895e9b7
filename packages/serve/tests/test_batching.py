"""`halyard.serve.batching`: the whole-array layout of a step's inputs equals the one built a sequence at a time
(`ragged_batch` and a row-by-row reference of `step_inputs`), array for array and bit for bit, and refuses what
`ragged_batch` refuses."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.models.attention.ragged_paged import ragged_batch
from halyard.serve.batching import ragged_layout, step_inputs
from halyard.serve.params import SamplingParams
from halyard.serve.program import ProgramShape, StepInputs
from halyard.serve.requests import RequestState
from halyard.serve.sampler import RowSettings
from halyard.serve.scheduler import Chunk

PAGE_SIZE = 4


def _same(got: object, want: object) -> None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for got_leaf, want_leaf in zip(got_leaves, want_leaves, strict=True):
        got_array, want_array = np.asarray(got_leaf), np.asarray(want_leaf)
        assert got_array.dtype == want_array.dtype and got_array.shape == want_array.shape
        assert got_array.tobytes() == want_array.tobytes()


sequences = st.lists(
    st.tuples(st.integers(1, 9), st.integers(0, 12), st.integers(0, 2)),  # q_len, keys before, spare pages
    min_size=0,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(sequences, st.integers(0, 2), st.integers(0, 3))
def test_ragged_layout_is_ragged_batch(rows: list, spare_seqs: int, spare_tokens: int) -> None:
    rng = np.random.default_rng(len(rows))
    q_lens = [q for q, _, _ in rows]
    kv_lens = [q + before for q, before, _ in rows]
    tables = [
        rng.permutation(64)[: -(-kv // PAGE_SIZE) + spare].tolist()
        for kv, (_, _, spare) in zip(kv_lens, rows)
    ]
    shape = ProgramShape(
        tokens=sum(q_lens) + spare_tokens,
        seqs=len(rows) + spare_seqs,
        seq_pages=max((len(t) for t in tables), default=1),
        prompt_logprobs=False,
    )
    want = ragged_batch(
        q_lens,
        kv_lens,
        tables,
        page_size=PAGE_SIZE,
        tokens=shape.tokens,
        seqs=shape.seqs,
        pages=shape.seq_pages,
    )
    _same(ragged_layout(np.asarray(q_lens), np.asarray(kv_lens), tables, shape, PAGE_SIZE), want)


@pytest.mark.parametrize(
    ("q_lens", "kv_lens", "tables", "tokens", "seqs", "pages"),
    [
        ([2], [2], [[0]], 1, 1, 1),  # more tokens than the batch holds
        ([1, 1], [1, 1], [[0], [1]], 2, 1, 1),  # more sequences than slots
        ([0], [1], [[0]], 2, 1, 1),  # no new token
        ([3], [2], [[0]], 4, 1, 1),  # more new tokens than keys
        ([1], [5], [[0]], 4, 1, 2),  # too few pages for the keys
        ([1], [1], [[0, 1, 2]], 4, 1, 2),  # more pages than a sequence reads
    ],
)
def test_ragged_layout_refuses_what_ragged_batch_refuses(
    q_lens, kv_lens, tables, tokens, seqs, pages
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="ragged_batch"):
        ragged_batch(q_lens, kv_lens, tables, page_size=PAGE_SIZE, tokens=tokens, seqs=seqs, pages=pages)
    shape = ProgramShape(tokens=tokens, seqs=seqs, seq_pages=pages, prompt_logprobs=False)
    with pytest.raises(ValueError, match="ragged_layout"):
        ragged_layout(np.asarray(q_lens), np.asarray(kv_lens), tables, shape, PAGE_SIZE)


def _reference_inputs(chunks, shape, tables, requests):  # type: ignore[no-untyped-def]
    """`step_inputs` a row at a time (as it was written before it was vectorized)."""
    seqs, length = shape.seqs, shape.tokens
    q_lens = [c.stop - c.start for c in chunks]
    batch = ragged_batch(
        q_lens, [c.stop for c in chunks], tables,
        page_size=PAGE_SIZE, tokens=length, seqs=seqs, pages=shape.seq_pages,
    )  # fmt: skip
    tokens, last = np.zeros((length,), np.int32), np.zeros((seqs,), np.int32)
    temperature, top_k = np.zeros((seqs,), np.float32), np.zeros((seqs,), np.int32)
    top_p, min_p = np.ones((seqs,), np.float32), np.zeros((seqs,), np.float32)
    seed, sample = np.zeros((seqs, 2), np.uint32), np.zeros((seqs,), np.int32)
    position = np.zeros((seqs,), np.int32)
    next_tokens = np.full((length,), -1, np.int32) if shape.prompt_logprobs else None
    for row, (chunk, request) in enumerate(zip(chunks, requests, strict=True)):
        start, sequence, params = int(batch.cu_q_lens[row]), chunk.sequence, request.params
        tokens[start : start + q_lens[row]] = sequence.tokens[chunk.start : chunk.stop]
        last[row] = start + q_lens[row] - 1
        temperature[row], top_k[row], top_p[row], min_p[row] = (
            params.temperature, params.top_k, params.top_p, params.min_p,
        )  # fmt: skip
        seed[row] = ((params.seed >> 32) & 0xFFFFFFFF, params.seed & 0xFFFFFFFF)
        sample[row] = request.sample_of(sequence).index
        position[row] = chunk.stop
        if next_tokens is not None:
            following = sequence.tokens[chunk.start + 1 : min(chunk.stop + 1, sequence.prompt_length)]
            next_tokens[start : start + len(following)] = following
    settings = RowSettings(temperature, top_k, top_p, min_p, seed, sample, position)
    return StepInputs(tokens, batch, last, settings, next_tokens)


@pytest.mark.parametrize("prompt_logprobs", [False, True])
def test_step_inputs_equal_a_row_by_row_layout(prompt_logprobs: bool) -> None:
    rng = np.random.default_rng(3)
    chunks, requests, tables = [], [], []
    for index in range(5):
        prompt = rng.integers(0, 100, int(rng.integers(2, 12))).tolist()
        params = SamplingParams(
            temperature=float(rng.uniform(0.1, 2)), top_k=int(rng.integers(0, 9)), top_p=float(rng.uniform(0.1, 1)),
            min_p=float(rng.uniform(0, 0.3)), seed=int(rng.integers(0, 2**63 - 1)), n=2,
        )  # fmt: skip
        request = RequestState(f"r{index}", prompt, params, 2 * index, ())
        sequence = request.samples[index % 2].sequence
        generated = int(rng.integers(0, 3))
        sequence.tokens += rng.integers(0, 100, generated).tolist()
        start = int(rng.integers(0, len(sequence.tokens)))
        chunks.append(Chunk(sequence, start, len(sequence.tokens)))
        requests.append(request)
        tables.append(rng.permutation(40)[: -(-len(sequence.tokens) // PAGE_SIZE)].tolist())
    shape = ProgramShape(tokens=64, seqs=8, seq_pages=4, prompt_logprobs=prompt_logprobs)
    _same(
        step_inputs(chunks, shape, tables, requests, PAGE_SIZE),
        _reference_inputs(chunks, shape, tables, requests),
    )
