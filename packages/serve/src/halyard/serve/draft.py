"""`DraftProposer`: a small draft model proposes each decoding row's next tokens (`halyard.serve.speculation`).

The draft model has a page pool and a `ModelRunner` of its own, and a copy of each speculating sequence.
Each step it first catches up with the tokens the target accepted since (its keys and values of proposals
the target rejected are dropped: its ``computed`` goes back to the tokens both agree on, and its pages past
them go back to its pool), feeding at most ``chunk_size`` tokens a row a program, then draws one token
a program, ``k`` in all. A row draws with its request's settings and the key of the position it draws at
(`halyard.serve.sampler.row_keys`), the key the target draws that position with, so for a greedy request a
proposal is kept exactly when the draft's argmax is the target's, and in general when the two Gumbel-max
draws agree.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from halyard.models import CausalLM
from halyard.serve.batching import program_groups, step_inputs, with_previous_tokens
from halyard.serve.config import EngineConfig
from halyard.serve.pages import OutOfPages, PageAllocator
from halyard.serve.requests import RequestState
from halyard.serve.runner import ModelRunner, fetched
from halyard.serve.scheduler import Chunk, SequenceState


class DraftProposer:
    """Proposals from ``draft`` (see the module docstring).

    Args:
        draft: the draft model (the target's vocabulary: its tokenizer).
        config: the engine's config (page size, pool, rows, chunk size, ``speculative_tokens``).
        vocab_size: the target's vocabulary.

    Raises:
        ValueError: the draft's vocabulary differs from the target's.
    """

    def __init__(self, draft: CausalLM, config: EngineConfig, vocab_size: int):
        draft_vocab = draft.unembedding.axis_size("vocab")
        if draft_vocab != vocab_size:
            raise ValueError(
                f"speculative draft model: its vocabulary has {draft_vocab} tokens, the served model's "
                f"{vocab_size}; give a draft with the same tokenizer"
            )
        context = config.context_for(draft)
        # every running sequence's tokens plus its proposals
        spare = config.max_running * -(-config.speculative_tokens // config.page_size + 1)
        self.pages = PageAllocator(config.num_pages + spare, config.page_size)
        self.max_seqs, self.chunk_size = config.max_running, config.chunk_size
        self.max_tokens = config.max_running * config.chunk_size
        self.runner = ModelRunner(
            draft,
            num_pages=self.pages.num_pages,
            page_size=config.page_size,
            max_seq_pages=self.pages.pages_for(context),
            max_tokens=self.max_tokens,
            max_seqs=self.max_seqs,
        )
        self._copies: dict[Hashable, tuple[SequenceState, SequenceState]] = {}  # key: (target's, draft's)

    def propose(
        self, chunks: Sequence[Chunk], requests: Sequence[RequestState], counts: Sequence[int]
    ) -> list[tuple[int, ...]]:
        """At most ``counts[i]`` tokens for each decoding chunk, drawn by the draft model."""
        self._forget_ended()
        copies = [self._synced(chunk.sequence) for chunk in chunks]
        request_of = {id(copy): request for copy, request in zip(copies, requests)}
        proposals: dict[int, list[int]] = {id(copy): [] for copy in copies}
        wanted = {id(copy): count for copy, count in zip(copies, counts)}
        while True:
            rows = [
                Chunk(copy, copy.computed, min(len(copy.tokens), copy.computed + self.chunk_size))
                for copy in copies
                if len(proposals[id(copy)]) < wanted[id(copy)]
            ]
            if not rows:
                return [tuple(proposals[id(copy)]) for copy in copies]
            for group in program_groups(rows, self.max_seqs, self.max_tokens):
                group = [row for row in group if self._reserved(row)]
                for row in rows:
                    if row.sequence.key not in self._copies:  # no pages left for it: no more proposals
                        wanted[id(row.sequence)] = len(proposals[id(row.sequence)])
                if not group:
                    continue
                drawn = self._run(group, [request_of[id(row.sequence)] for row in group])
                for row, token in zip(group, drawn):
                    row.sequence.computed = row.stop
                    if row.samples:
                        row.sequence.tokens.append(token)
                        proposals[id(row.sequence)].append(token)

    def _reserved(self, row: Chunk) -> bool:
        """Reserve the draft's pages for ``row``; when the pool has too few, forget its copy (it starts
        again at a later step) and return False."""
        try:
            self.pages.reserve(row.sequence.key, row.stop)
        except OutOfPages:
            self.pages.release(row.sequence.key)
            del self._copies[row.sequence.key]
            return False
        return True

    def _run(self, chunks: list[Chunk], requests: list[RequestState]) -> list[int]:
        """One draft program over ``chunks``; the token each row draws."""
        tables = [self.pages.pages_of(chunk.sequence.key) for chunk in chunks]
        shape = self.runner.shape_for(sum(c.fed for c in chunks), max(len(t) for t in tables))
        inputs = step_inputs(chunks, shape, tables, requests, self.pages.page_size)
        inputs = with_previous_tokens(inputs, chunks, None, self.runner.max_seqs)
        outputs = fetched(self.runner.run(shape, inputs))
        return [int(token) for token in outputs.token[: len(chunks)]]

    def _synced(self, sequence: SequenceState) -> SequenceState:
        """The draft's copy of ``sequence``: its tokens the target's now, its keys and values kept for the
        tokens both agree on (a new copy for a sequence not seen yet)."""
        target, copy = self._copies.get(sequence.key, (sequence, None))
        if copy is None or target is not sequence:
            if copy is not None:
                self.pages.release(copy.key)
            copy = SequenceState(sequence.key, sequence.group, [], sequence.prompt_length, sequence.arrival)
            self.pages.add(copy.key)
            self._copies[sequence.key] = (sequence, copy)
        agreed = 0
        for mine, theirs in zip(copy.tokens, sequence.tokens):
            if mine != theirs:
                break
            agreed += 1
        copy.tokens = list(sequence.tokens)
        copy.computed = min(copy.computed, agreed, len(copy.tokens) - 1)
        self.pages.truncate(copy.key, copy.computed)
        return copy

    def _forget_ended(self) -> None:
        """Release the copies of sequences that ended or were preempted (a preempted one starts again)."""
        for key, (target, copy) in list(self._copies.items()):
            if not target.running:
                self.pages.release(copy.key)
                del self._copies[key]
