"""One program of an engine step, from its dispatch to its results folded into the requests.

`dispatch` lays out a program's chunks as its inputs (taking the tokens the program before it drew and
nobody fetched yet from that program's outputs on the device), starts it, and while it runs does what does
not depend on its tokens: the chunks' tokens count as computed, full prompt pages go to the prefix cache,
and in a pipelined step each token it will draw holds a `PLACEHOLDER` in its sequence. `absorb` folds what
one row drew, once fetched, into its request: the token (over its placeholder), its log-probs and
alternatives, the prompt log-probs of the chunk, and the end of a sample that it ended.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from halyard.serve.batching import step_inputs, token_adapters, with_previous_tokens
from halyard.serve.pages import PageAllocator
from halyard.serve.program import StepOutputs
from halyard.serve.requests import RequestState
from halyard.serve.runner import ModelRunner
from halyard.serve.scheduler import Chunk, Scheduler
from halyard.serve.stats import EngineStats

PLACEHOLDER = -1
"""A drawn token not fetched yet, in its sequence's tokens (a pipelined engine's next step feeds it from the
device)."""

Dispatched = tuple[list[Chunk], list[RequestState], StepOutputs]
"""A program dispatched: its chunks, their requests, its outputs (on the device)."""


def dispatch(
    chunks: list[Chunk],
    requests: list[RequestState],
    previous: Dispatched | None,
    *,
    pipelined: bool,
    runner: ModelRunner,
    pages: PageAllocator,
    stats: EngineStats,
    prefix_cache: bool,
    speculative_tokens: int = 0,
) -> Dispatched:
    """Lay out ``chunks`` as one program's inputs and start it; its outputs stay on the device.

    Args:
        chunks: the program's chunks, in row order.
        requests: each chunk's request.
        previous: the program in flight, whose drawn tokens ``chunks`` hold as placeholders (None: none).
        pipelined: its own tokens are fetched at the next step; placeholders hold their places meanwhile.
        runner: runs the program.
        pages: the page table (each sequence's pages; the prefix cache).
        stats: counts the tokens fed.
        prefix_cache: register the pages the chunks fill in the prefix cache.
        speculative_tokens: the most proposals a chunk holds (a program with any draws one more token
            than that per row: one program shape whatever the step proposed).
    """
    tables = [pages.pages_of(chunk.sequence.key) for chunk in chunks]
    wants_prompt = any(
        r.params.prompt_logprobs and r.sample_of(c.sequence).index == 0 and c.start < c.sequence.prompt_length
        for c, r in zip(chunks, requests)
    )
    alternatives = any(r.params.top_logprobs > 0 and c.samples for c, r in zip(chunks, requests))
    shape = runner.shape_for(
        sum(c.fed for c in chunks),
        max(len(t) for t in tables),
        prompt_logprobs=wants_prompt,
        alternatives=alternatives,
        adjusted=constrained_rows(chunks, requests),
        draws=1 + speculative_tokens if any(c.proposals for c in chunks) else 1,
        adapters=any(chunk.sequence.adapter for chunk in chunks),
    )
    inputs = step_inputs(chunks, shape, tables, requests, pages.page_size)
    if shape.adapters:
        inputs = inputs._replace(adapters=token_adapters(chunks, shape.tokens))
    drawn = None if previous is None else (previous[0], previous[2].padded_token)
    inputs = with_previous_tokens(inputs, chunks, drawn, runner.max_seqs)
    outputs = runner.run(shape, inputs)
    stats.tokens_computed += int(inputs.batch.cu_q_lens[len(chunks)])
    for chunk, request in zip(chunks, requests):  # while it runs: what does not depend on its tokens
        sequence = chunk.sequence
        sequence.computed = chunk.stop
        if prefix_cache and PLACEHOLDER not in sequence.tokens[chunk.start : chunk.stop]:
            pages.register(sequence.key, sequence.tokens, chunk.stop)
        if chunk.samples and request.sample_of(sequence).index == 0:
            request.prompt_written = True  # its siblings may start (from the prefix cache)
        last = chunk.stop + 1 - sequence.prompt_length >= request.params.max_tokens
        if pipelined and chunk.samples and not last:
            sequence.tokens.append(PLACEHOLDER)  # its token, once fetched, goes at index chunk.stop
    return chunks, requests, outputs


def constrained_rows(chunks: list[Chunk], requests: list[RequestState]) -> bool:
    """Whether any of ``chunks`` draws a token under a grammar or a logit bias (its program then takes
    `halyard.serve.sampler.LogitAdjustments`)."""
    return any(c.samples and r.params.constrained for c, r in zip(chunks, requests))


def absorb_program(
    program: Dispatched,
    outputs: StepOutputs,
    running: dict[Hashable, RequestState],
    *,
    pages: PageAllocator,
    scheduler: Scheduler,
    stats: EngineStats,
    prefix_cache: bool,
) -> list[RequestState]:
    """Fold in what every row of a fetched program drew (`absorb`), but for rows whose request is no longer
    running (cancelled, or ended by a stop string, since the program was dispatched).

    Args:
        program: the program as dispatched.
        outputs: its outputs, on the host (`halyard.serve.runner.fetched`).
        running: the unfinished requests by id.
        pages, scheduler, stats, prefix_cache: as `absorb` takes them.

    Returns:
        The requests of the rows folded in, in row order (a request once per row).
    """
    chunks, requests, _ = program
    drawn = outputs._replace(  # one conversion to Python numbers for all rows, not three a row
        token=outputs.token.tolist(),
        logprob=outputs.logprob.tolist(),
        sampled_logprob=outputs.sampled_logprob.tolist(),
    )
    touched, start = [], 0
    for row, (chunk, request) in enumerate(zip(chunks, requests)):
        if running.get(request.request_id) is request:
            touched.append(request)
            absorb(
                row, start, chunk, request, drawn,
                pages=pages, scheduler=scheduler, stats=stats, prefix_cache=prefix_cache,
            )  # fmt: skip
        start += chunk.fed
    return touched


def absorb(
    row: int,
    start: int,
    chunk: Chunk,
    request: RequestState,
    outputs: StepOutputs,
    *,
    pages: PageAllocator,
    scheduler: Scheduler,
    stats: EngineStats,
    prefix_cache: bool,
) -> None:
    """Fold in what one row of a fetched program drew.

    Args:
        row: the row of ``chunk`` in the program.
        start: the flat index of the chunk's first token in the program.
        chunk, request: the row's chunk and its request.
        outputs: the program's outputs, on the host (`halyard.serve.runner.fetched`; ``token``, ``logprob``
            and ``sampled_logprob`` may be lists).
        pages: the page table (the prefix cache, its placeholders now resolved).
        scheduler: drops the sequence when its sample ends.
        stats: counts the tokens drawn.
        prefix_cache: register the sequence's computed pages in the prefix cache.
    """
    sequence = chunk.sequence
    sample = request.sample_of(sequence)
    if sample.finish_reason is not None:
        return  # a pipelined step's row of a sample that ended at the step before
    if outputs.next_logprob is not None and sample.index == 0:
        _absorb_prompt_logprobs(start, chunk, request, outputs)
    if chunk.samples:
        accepted = _add_drawn(row, chunk, request, outputs)
        stats.tokens_generated += accepted + 1
        stats.tokens_proposed += len(chunk.proposals)
        stats.tokens_accepted += accepted
        if (
            chunk.proposals
        ):  # the keys and values of the proposals it drew itself stay; the others are dropped
            sequence.computed = chunk.stop + accepted
            if sequence.running:
                pages.truncate(sequence.key, len(sequence.tokens))
    if prefix_cache and sequence.running:
        pages.register(sequence.key, sequence.tokens, sequence.computed)  # placeholders resolved
    if sample.finish_reason is not None:
        scheduler.remove(sequence)


def _add_drawn(row: int, chunk: Chunk, request: RequestState, outputs: StepOutputs) -> int:
    """Add the tokens row ``row`` drew to its sample: the first, then, while each equals the proposal fed
    there, the one drawn after it (a speculative row's outputs are ``[seqs, draws]``). Returns how many
    proposals were accepted."""
    sample = request.sample_of(chunk.sequence)
    spread = isinstance(outputs.token[row], (list, np.ndarray))
    for index in range(len(chunk.proposals) + 1):

        def at(values: Any, index: int = index) -> Any:
            return values[row][index] if spread else values[row]

        top: list[tuple[int, float]] = []
        if request.params.top_logprobs and outputs.top_tokens is not None:
            pairs = zip(at(outputs.top_tokens), at(outputs.top_logprobs))
            top = [(int(t), float(v)) for t, v in pairs][: request.params.top_logprobs]
        token = int(at(outputs.token))
        request.add_token(
            chunk.sequence, chunk.stop + index, token, float(at(outputs.logprob)),
            float(at(outputs.sampled_logprob)), top,
        )  # fmt: skip
        if (
            sample.finish_reason is not None
            or index == len(chunk.proposals)
            or token != chunk.proposals[index]
        ):
            return index
    raise AssertionError("unreachable: the last draw returns")


def _absorb_prompt_logprobs(start: int, chunk: Chunk, request: RequestState, outputs: StepOutputs) -> None:
    """Fold in the prompt log-probs of ``chunk``'s tokens (from flat index ``start`` of the program)."""
    assert outputs.next_logprob is not None and outputs.next_top_tokens is not None
    assert outputs.next_top_logprobs is not None
    prompt_length = chunk.sequence.prompt_length
    if len(request.prompt_logprobs) != chunk.start + 1 or chunk.start >= prompt_length - 1:
        return  # already collected (a recomputation) or no prompt position follows
    count = min(chunk.stop, prompt_length - 1) - chunk.start
    logprobs = [float(v) for v in outputs.next_logprob[start : start + count]]
    top = [
        [
            (int(t), float(v))
            for t, v in zip(outputs.next_top_tokens[start + i], outputs.next_top_logprobs[start + i])
        ][: request.params.top_logprobs]
        for i in range(count)
    ]
    update = request.add_prompt_logprobs(logprobs, top)
    if update is not None:
        request.samples[0].pending = update
