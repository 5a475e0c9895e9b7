"""Speculative decoding: a decoding row proposes its next tokens, and one step verifies them.

A row that decodes token ``t`` at position ``p`` (`halyard.serve.scheduler.Chunk`) is given proposals
``x_0 .. x_{m-1}`` (at most `EngineConfig.speculative_tokens`), fed after ``t`` in the same ragged step, so
that the step draws at positions ``p+1 .. p+m+1`` (`ProgramShape.draws`): each draw is the row's own, from
the target model's distribution at that position with the request's settings and the key of that position
alone (`halyard.serve.sampler.repeated_rows`). The engine keeps the first draw, and the next one while the
draw before it equals the proposal fed there (`halyard.serve.step_programs.absorb`): a row emits 1 to
``m + 1`` tokens a step, and the keys and values of rejected proposals are dropped (the sequence's
``computed`` stops before them, pages past its tokens go back to the pool: `PageAllocator.truncate`; what
stays in a kept page is overwritten when the real token is fed).

Every token emitted is the token the row would have drawn without speculation (the same distribution,
the same key): greedy output equals the unspeculated one token for token, a seeded request draws the same
tokens, and deterministic mode stays bitwise. For prompt lookup (``ngram``) the proposal is a point mass,
and this is exactly speculative rejection sampling: ``x`` is accepted with probability ``p(x) = min(1,
p(x)/1)``, and on rejection the token drawn is distributed as ``p`` without ``x``, renormalized
(``norm(max(p - q, 0))``). A draft model (``draft``, `halyard.serve.draft`) draws its proposals with the
same keys from its own distribution ``q`` (a Gumbel-max coupling of ``q`` and ``p``): the emitted tokens
are still exactly the target's draws, while a draft token is kept with probability
``P(argmax(log p + g) = argmax(log q + g))``, at most ``sum min(p, q)`` (which rejection sampling reaches):
equal for greedy requests.

What it costs: a speculative step runs unpipelined (its proposals need the tokens the step before drew, on
the host), its decoding rows feed ``1 + m`` tokens and unembed and draw at each, and a program of another
shape (``draws``) compiles at first use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import numpy as np

from halyard.models import CausalLM
from halyard.serve.config import EngineConfig
from halyard.serve.pages import OutOfPages, PageAllocator
from halyard.serve.requests import RequestState
from halyard.serve.scheduler import Chunk


def ngram_proposal(tokens: Sequence[int], count: int, max_n: int = 3, min_n: int = 1) -> tuple[int, ...]:
    """Prompt lookup: the ``count`` tokens that followed the latest earlier occurrence of the last ``n``
    tokens (``n`` from ``max_n`` down to ``min_n``, the first that occurs), continued periodically where
    the occurrence overlaps the end (a repeating pattern proposes its continuation); ``()`` when none does."""
    if count < 1:
        return ()
    values = np.asarray(tokens)
    length = len(values)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        starts = length - n  # candidate starts 0 .. length - n - 1: each has a following token
        matches = np.ones(starts, bool)
        for i in range(n):
            matches &= values[i : starts + i] == values[starts + i]
        found = np.flatnonzero(matches)
        if len(found):
            continued = values[int(found[-1]) + n :].tolist()  # what followed, up to the end
            for i in range(count):
                continued.append(continued[i])
            return tuple(continued[-count:])
    return ()


class Proposer(Protocol):
    """Proposes each row's next tokens (`halyard.serve.speculation`)."""

    def propose(
        self, chunks: Sequence[Chunk], requests: Sequence[RequestState], counts: Sequence[int]
    ) -> list[tuple[int, ...]]:
        """At most ``counts[i]`` proposed tokens for each decoding chunk."""
        ...


class NgramProposer:
    """`ngram_proposal` over each row's prompt and output."""

    def __init__(self, max_n: int = 3):
        self.max_n = max_n

    def propose(
        self, chunks: Sequence[Chunk], requests: Sequence[RequestState], counts: Sequence[int]
    ) -> list[tuple[int, ...]]:
        return [ngram_proposal(c.sequence.tokens, n, self.max_n) for c, n in zip(chunks, counts)]


def speculated(
    chunks: list[Chunk],
    request_of: Callable[[Hashable], RequestState],
    proposer: Proposer,
    *,
    tokens: int,
    pages: PageAllocator,
) -> list[Chunk]:
    """The decoding ``chunks`` with proposals: at most ``tokens`` each, fewer where ``max_tokens`` ends the
    sample sooner or the pool has too few free pages for them (nobody is preempted for a proposal); none
    for chunks that draw nothing or under a grammar (its mask follows the drawn tokens)."""
    chosen, counts = [], []
    for chunk in chunks:
        request = request_of(chunk.sequence.group)
        left = request.params.max_tokens - (chunk.stop + 1 - chunk.sequence.prompt_length)
        if chunk.samples and request.params.grammar is None and min(left, tokens) > 0:
            chosen.append(chunk)
            counts.append(min(left, tokens))
    if not chosen:
        return chunks
    proposals = proposer.propose(chosen, [request_of(c.sequence.group) for c in chosen], counts)
    replaced = {}
    for chunk, proposal in zip(chosen, proposals):
        if proposal:
            replaced[id(chunk)] = Chunk(
                chunk.sequence, chunk.start, chunk.stop, _fitted(chunk, proposal, pages)
            )
    return [replaced.get(id(chunk), chunk) for chunk in chunks]


def _fitted(chunk: Chunk, proposal: tuple[int, ...], pages: PageAllocator) -> tuple[int, ...]:
    """``proposal`` cut to what ``chunk``'s pages hold once it reserves what the pool has free."""
    key = chunk.sequence.key
    try:
        pages.reserve(key, chunk.stop + len(proposal))
    except OutOfPages:
        return proposal[: len(pages.pages_of(key)) * pages.page_size - chunk.stop]
    return proposal


def proposer_for(config: EngineConfig, draft: CausalLM | None, vocab_size: int) -> Proposer | None:
    """The proposer of ``config.speculative`` (None: ``none``).

    Raises:
        ValueError: ``draft`` given without ``speculative="draft"``, or missing with it, or of another
            vocabulary.
    """
    if (draft is not None) != (config.speculative == "draft"):
        raise ValueError(
            f"Engine(draft=...) goes with EngineConfig.speculative='draft' (got speculative="
            f"{config.speculative!r} and {'a' if draft is not None else 'no'} draft model)"
        )
    if config.speculative == "ngram":
        return NgramProposer(config.speculative_ngram)
    if draft is not None:
        from halyard.serve.draft import DraftProposer

        return DraftProposer(draft, config, vocab_size)
    return None
