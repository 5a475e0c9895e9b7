"""From the scheduler's chunks to one step program's flat, padded inputs (numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from halyard.models.attention.ragged_paged import ragged_batch
from halyard.serve.program import ProgramShape, StepInputs
from halyard.serve.requests import RequestState
from halyard.serve.sampler import RowSettings
from halyard.serve.scheduler import Chunk


def seed_halves(seed: int) -> tuple[int, int]:
    """A 63-bit seed as its high and low 32 bits."""
    return (seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF


def step_inputs(
    chunks: list[Chunk],
    shape: ProgramShape,
    page_tables: list[list[int]],
    requests: list[RequestState],
    page_size: int,
) -> StepInputs:
    """The inputs of one program: the chunks one after another in a flat batch, padded to ``shape``.

    Args:
        chunks: the sequences' chunks (at most ``shape.seqs``, at most ``shape.tokens`` tokens together).
        shape: the program's shape.
        page_tables: each sequence's pages in order (at most ``shape.seq_pages``).
        requests: each sequence's request.
        page_size: tokens per page.
    """
    seqs, length = shape.seqs, shape.tokens
    q_lens = [chunk.stop - chunk.start for chunk in chunks]
    batch = ragged_batch(
        q_lens, [chunk.stop for chunk in chunks], page_tables,
        page_size=page_size, tokens=length, seqs=seqs, pages=shape.seq_pages,
    )  # fmt: skip
    tokens = np.zeros((length,), np.int32)
    last = np.zeros((seqs,), np.int32)
    temperature = np.zeros((seqs,), np.float32)
    top_k = np.zeros((seqs,), np.int32)
    top_p = np.ones((seqs,), np.float32)
    min_p = np.zeros((seqs,), np.float32)
    seed = np.zeros((seqs, 2), np.uint32)
    sample = np.zeros((seqs,), np.int32)
    position = np.zeros((seqs,), np.int32)
    next_tokens = np.full((length,), -1, np.int32) if shape.prompt_logprobs else None
    for row, (chunk, request) in enumerate(zip(chunks, requests, strict=True)):
        start = int(batch.cu_q_lens[row])
        sequence = chunk.sequence
        tokens[start : start + q_lens[row]] = sequence.tokens[chunk.start : chunk.stop]
        last[row] = start + q_lens[row] - 1
        params = request.params
        temperature[row] = params.temperature
        top_k[row] = params.top_k
        top_p[row] = params.top_p
        min_p[row] = params.min_p
        assert params.seed is not None
        seed[row] = seed_halves(params.seed)
        sample[row] = request.sample_of(sequence).index
        position[row] = chunk.stop  # the position of the token to draw
        if next_tokens is not None:
            following = sequence.tokens[chunk.start + 1 : min(chunk.stop + 1, sequence.prompt_length)]
            next_tokens[start : start + len(following)] = following
    settings = RowSettings(temperature, top_k, top_p, min_p, seed, sample, position)
    return StepInputs(tokens, batch, last, settings, next_tokens)


def program_groups(chunks: list[Chunk], max_seqs: int, max_tokens: int) -> list[list[Chunk]]:
    """``chunks`` in order, cut into groups of at most ``max_seqs`` chunks and ``max_tokens`` tokens."""
    groups: list[list[Chunk]] = []
    tokens = 0
    for chunk in chunks:
        length = chunk.stop - chunk.start
        if not groups or len(groups[-1]) == max_seqs or tokens + length > max_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(chunk)
        tokens += length
    return groups


def with_previous_tokens(
    inputs: StepInputs, chunks: list[Chunk], previous: tuple[list[Chunk], Any] | None, max_seqs: int
) -> StepInputs:
    """A pipelined program's inputs: ``inputs`` (of ``chunks``) with ``fed_from`` and ``previous``, each fed
    token that the previous program drew and nobody fetched yet (a placeholder) taken from its outputs.

    Args:
        inputs, chunks: the program's inputs and chunks.
        previous: the previous program's chunks and its drawn tokens (``[max_seqs]``, on the device), or
            None when no program is in flight.
        max_seqs: the most sequences of one program.
    """
    fed_from = np.full(inputs.tokens.shape, -1, np.int32)
    if previous is None:
        return inputs._replace(fed_from=fed_from, previous=np.zeros((max_seqs,), np.int32))
    previous_chunks, drawn = previous
    drawn_at = {id(c.sequence): (c.stop, row) for row, c in enumerate(previous_chunks) if c.samples}
    start = 0
    for chunk in chunks:
        index, row = drawn_at.get(id(chunk.sequence), (-1, -1))
        if chunk.start <= index < chunk.stop:
            fed_from[start + index - chunk.start] = row
        start += chunk.stop - chunk.start
    return inputs._replace(fed_from=fed_from, previous=drawn)
