"""From the scheduler's chunks to one step program's flat, padded inputs (numpy)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from halyard.models.attention.ragged_paged import PADDING_SLOT, RaggedBatch
from halyard.serve.program import ProgramShape, StepInputs, no_adjustments
from halyard.serve.requests import RequestState
from halyard.serve.sampler import LogitAdjustments, RowSettings
from halyard.serve.scheduler import Chunk


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

    Raises:
        ValueError: ``requests`` and ``chunks`` differ in length, or the chunks do not fit ``shape``.
    """
    seqs, length, count = shape.seqs, shape.tokens, len(chunks)
    if len(requests) != count:
        raise ValueError(f"step_inputs: {count} chunks but {len(requests)} requests")
    starts = np.fromiter((chunk.start for chunk in chunks), np.int64, count)
    stops = np.fromiter((chunk.stop for chunk in chunks), np.int64, count)
    proposed = np.fromiter((len(chunk.proposals) for chunk in chunks), np.int64, count)
    batch = ragged_layout(stops - starts + proposed, stops + proposed, page_tables, shape, page_size)
    fed = itertools.chain.from_iterable(
        (*chunk.sequence.tokens[chunk.start : chunk.stop], *chunk.proposals) for chunk in chunks
    )
    total = int(batch.cu_q_lens[count])
    tokens = np.zeros((length,), np.int32)
    tokens[:total] = np.fromiter(fed, np.int32, total)
    last = np.zeros(
        (seqs,), np.int32
    )  # a row with proposals also draws after each of them (`ProgramShape.draws`)
    last[:count] = batch.cu_q_lens[1 : count + 1] - 1 - proposed
    params = [request.params for request in requests]
    seeds = np.asarray(
        [p.seed for p in params], np.uint64
    )  # 63 bits each, drawn by the engine when not given
    seed = np.zeros((seqs, 2), np.uint32)
    seed[:count, 0], seed[:count, 1] = seeds >> np.uint64(32), seeds & np.uint64(0xFFFFFFFF)  # high, low
    settings = RowSettings(
        temperature=_padded([p.temperature for p in params], seqs, np.float32, 0),
        top_k=_padded([p.top_k for p in params], seqs, np.int32, 0),
        top_p=_padded([p.top_p for p in params], seqs, np.float32, 1),
        min_p=_padded([p.min_p for p in params], seqs, np.float32, 0),
        seed=seed,
        sample=_padded([r.sample_of(c.sequence).index for c, r in zip(chunks, requests)], seqs, np.int32, 0),
        position=_padded(stops, seqs, np.int32, 0),  # the position of the token each row draws
    )
    next_tokens = None
    if shape.prompt_logprobs:
        next_tokens = np.full((length,), -1, np.int32)
        for chunk, start in zip(chunks, batch.cu_q_lens.tolist()):
            sequence = chunk.sequence
            following = sequence.tokens[chunk.start + 1 : min(chunk.stop + 1, sequence.prompt_length)]
            next_tokens[start : start + len(following)] = following
    adjustments = None
    if shape.mask_words:
        adjustments = no_adjustments(seqs, shape.mask_words)
        for row, (chunk, request) in enumerate(zip(chunks, requests)):
            if chunk.samples:
                _adjust(adjustments, row, request, request.sample_of(chunk.sequence).constraint)
    return StepInputs(tokens, batch, last, settings, next_tokens, adjustments=adjustments)


def token_adapters(chunks: list[Chunk], tokens: int) -> np.ndarray:
    """int32 ``[tokens]``: the LoRA adapter of each fed token's sequence (`StepInputs.adapters`; 0 for the
    base and the padding)."""
    lengths = [chunk.stop - chunk.start for chunk in chunks]
    adapters = np.zeros((tokens,), np.int32)
    adapters[: sum(lengths)] = np.repeat([chunk.sequence.adapter for chunk in chunks], lengths)
    return adapters


def _adjust(adjustments: LogitAdjustments, row: int, request: RequestState, constraint: Any) -> None:
    """Write row ``row``'s grammar mask (its sample's next tokens; ``constraint`` None: all) and biases."""
    if constraint is not None:
        constraint.fill_mask(adjustments.allowed, row)
    biases = request.params.logit_bias
    if biases:
        adjustments.bias_tokens[row, : len(biases)] = [token for token, _ in biases]
        adjustments.bias_values[row, : len(biases)] = [bias for _, bias in biases]


def _padded(values: Any, size: int, dtype: Any, fill: int) -> np.ndarray:
    """``values`` (one per row) in an array of ``size`` rows, the rest ``fill``."""
    padded = np.full((size,), fill, dtype)
    padded[: len(values)] = values
    return padded


def ragged_layout(
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    page_tables: Sequence[Sequence[int]],
    shape: ProgramShape,
    page_size: int,
) -> RaggedBatch:
    """`halyard.models.attention.ragged_paged.ragged_batch`'s layout of ``shape``'s flat batch, computed with
    whole-array numpy operations rather than one sequence at a time (an engine step lays out hundreds).

    Args:
        q_lens: int ``[count]``: each sequence's new tokens this step (at least 1).
        kv_lens: int ``[count]``: each sequence's keys after this step (at least its ``q_len``).
        page_tables: each sequence's pages in order (enough for its ``kv_len``; at most ``shape.seq_pages``).
        shape: the program's shape (its tokens, sequence slots and pages per sequence).
        page_size: tokens per page.

    Raises:
        ValueError: the sequences do not fit ``shape``, or a sequence's lengths or pages disagree.
    """
    tokens, seqs, pages = shape.tokens, shape.seqs, shape.seq_pages
    q_lens, kv_lens = np.asarray(q_lens, np.int64), np.asarray(kv_lens, np.int64)
    count = len(q_lens)
    owned = np.fromiter(map(len, page_tables), np.int64, len(page_tables))
    total = int(q_lens.sum())
    if not len(kv_lens) == len(owned) == count or count > seqs or total > tokens:
        raise ValueError(
            f"ragged_layout: {count} sequences ({len(kv_lens)} kv_lens, {len(owned)} page tables) of {total} "
            f"tokens for {seqs} slots of {tokens} tokens"
        )
    wrong = (q_lens < 1) | (q_lens > kv_lens) | (-(-kv_lens // page_size) > owned) | (owned > pages)
    if wrong.any():
        index = int(np.argmax(wrong))
        raise ValueError(
            f"ragged_layout: sequence {index} has q_len {q_lens[index]}, kv_len {kv_lens[index]} and "
            f"{owned[index]} pages (of at most {pages}, page_size {page_size})"
        )
    table = np.zeros((seqs, pages), np.int32)
    page_rows = np.repeat(np.arange(count), owned)
    page_columns = np.arange(len(page_rows)) - np.repeat(np.cumsum(owned) - owned, owned)
    table[page_rows, page_columns] = np.fromiter(
        itertools.chain.from_iterable(page_tables), np.int32, len(page_rows)
    )
    cu = np.zeros((seqs + 1,), np.int32)
    cu[1 : count + 1] = np.cumsum(q_lens)
    cu[count + 1 :] = total
    row = np.repeat(np.arange(count), q_lens)
    position = kv_lens[row] - q_lens[row] + np.arange(total) - cu[row]
    positions = np.full((tokens,), -1, np.int32)
    positions[:total] = position
    slots = np.full((tokens,), PADDING_SLOT, np.int32)
    slots[:total] = table[row, position // page_size] * page_size + position % page_size
    lengths = np.zeros((seqs,), np.int32)
    lengths[:count] = kv_lens
    return RaggedBatch(positions, slots, table, cu, lengths, np.asarray(count, np.int32))


def program_groups(chunks: list[Chunk], max_seqs: int, max_tokens: int) -> list[list[Chunk]]:
    """``chunks`` in order, cut into groups of at most ``max_seqs`` chunks and ``max_tokens`` tokens."""
    groups: list[list[Chunk]] = []
    tokens = 0
    for chunk in chunks:
        length = chunk.fed
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
        start += chunk.fed
    return inputs._replace(fed_from=fed_from, previous=drawn)
