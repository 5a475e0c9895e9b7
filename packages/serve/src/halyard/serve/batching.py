"""From the scheduler's chunks to one program's padded inputs (numpy)."""

from __future__ import annotations

import numpy as np

from halyard.serve.program import ProgramShape, StepInputs
from halyard.serve.requests import RequestState
from halyard.serve.sampler import RowSettings
from halyard.serve.scheduler import Chunk


def seed_halves(seed: int) -> tuple[int, int]:
    """A 63-bit seed as its high and low 32 bits."""
    return (seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF


def step_inputs(
    chunks: list[Chunk], shape: ProgramShape, page_tables: list[list[int]], requests: list[RequestState]
) -> StepInputs:
    """The inputs of one program: each chunk one row, padded to ``shape``.

    Args:
        chunks: the rows' chunks (at most ``shape.rows``, each at most ``shape.tokens`` tokens).
        shape: the program's shape.
        page_tables: each row's pages in order (at most ``shape.seq_pages``).
        requests: each row's request.
    """
    rows, length = shape.rows, shape.tokens
    tokens = np.zeros((rows, length), np.int32)
    positions = np.full((rows, length), -1, np.int32)
    table = np.zeros((rows, shape.seq_pages), np.int32)
    last = np.zeros((rows,), np.int32)
    temperature = np.zeros((rows,), np.float32)
    top_k = np.zeros((rows,), np.int32)
    top_p = np.ones((rows,), np.float32)
    min_p = np.zeros((rows,), np.float32)
    seed = np.zeros((rows, 2), np.uint32)
    sample = np.zeros((rows,), np.int32)
    position = np.zeros((rows,), np.int32)
    next_tokens = np.full((rows, length), -1, np.int32) if shape.prompt_logprobs else None
    for row, (chunk, pages, request) in enumerate(zip(chunks, page_tables, requests, strict=True)):
        fed = chunk.stop - chunk.start
        sequence = chunk.sequence
        tokens[row, :fed] = sequence.tokens[chunk.start : chunk.stop]
        positions[row, :fed] = np.arange(chunk.start, chunk.stop)
        table[row, : len(pages)] = pages
        last[row] = fed - 1
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
            next_tokens[row, : len(following)] = following
    settings = RowSettings(temperature, top_k, top_p, min_p, seed, sample, position)
    return StepInputs(tokens, positions, table, last, settings, next_tokens)
