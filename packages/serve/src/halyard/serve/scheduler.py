"""`Scheduler`: which sequences run in the next engine step (admission, chunked prefill, preemption; no JAX).

A sequence is a prompt plus what it generated so far; ``computed`` of its tokens have their keys and values
in pages. Each step feeds every running sequence tokens it still lacks, and when the fed run reaches its
last token the engine samples a new one. Prompt tokens are *prefilled*, at most ``chunk_size`` of them a
step (a long prompt goes in chunks, beside the decoding rows of the others); generated tokens are *decoded*,
one a step, all decoding sequences together, one row each. A step's program holds a fixed number of tokens
(its bucket), so when the chunks leave some of it as padding, more prompt chunks fill it: sequences past
``max_prefill_rows``, each chunk cut to what is left, taking only free rows and pages (``step_room``).

Admission is fair between *callers* (a caller is whoever sent the request: one HTTP request's prompts and
samples share one): the waiting sequence whose caller runs the fewest sequences goes first, arrival order
breaking ties, while there are rows and pages (a sample of an ``n > 1`` request waits until its first sibling
has written the prompt, then finds the prompt's full pages in the prefix cache). When it finds no row or
too few pages and another caller runs at least two sequences more than its own, that caller's newest
sequence is preempted to make room, so a request of many samples cannot keep a small one waiting for all
of them. When a running sequence needs a page and none is left, the newest sequence of the caller running
the most is preempted (among single-sample callers: the most recently arrived). A preempted sequence's
pages are released and it waits again, keeping its generated tokens; readmitted, it recomputes them (much
of it from the prefix cache) and continues exactly where it stopped, never with a wrong or a shortened
answer.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Hashable

from halyard.serve.pages import OutOfPages, PageAllocator


@dataclasses.dataclass(eq=False)
class SequenceState:
    """One sample of one request, as the scheduler and the engine track it.

    Attributes:
        key: a unique hashable id (its owner key in the `PageAllocator`).
        group: the request it belongs to (samples of one request share it).
        caller: whom admission is fair between (the requests of one HTTP request share it; default: the
            group).
        tokens: prompt and generated tokens so far.
        prompt_length: how many of ``tokens`` are the prompt.
        arrival: order of arrival (smaller runs first; kept through preemption).
        use_prefix_cache: may start from cached pages (not when prompt log-probs are wanted).
        computed: tokens whose keys and values are in pages.
        running: admitted and holding pages.
        preemptions: how many times it was preempted.
        adapter: the LoRA adapter its tokens run with (0: the base); its cached pages are its adapter's own.
    """

    key: Hashable
    group: Hashable
    tokens: list[int]
    prompt_length: int
    arrival: int
    use_prefix_cache: bool = True
    caller: Hashable = None
    computed: int = 0
    running: bool = False
    preemptions: int = 0
    adapter: int = 0

    def __post_init__(self) -> None:
        if self.caller is None:
            self.caller = self.group

    @property
    def missing(self) -> int:
        """Tokens not yet in pages."""
        return len(self.tokens) - self.computed


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Feed ``sequence.tokens[start:stop]``; a new token is sampled when ``stop`` is the last token.

    Attributes:
        proposals: speculative tokens fed after ``stop`` (`halyard.serve.speculation`): the step draws a
            token after each of them too, and keeps those that follow the proposals it drew itself.
        samples: whether the step samples a token after this chunk (``stop`` was the sequence's length
            when the chunk was made).
    """

    sequence: SequenceState
    start: int
    stop: int
    proposals: tuple[int, ...] = ()
    samples: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", self.stop == len(self.sequence.tokens))

    @property
    def fed(self) -> int:
        """The tokens the step feeds for this chunk (its proposals included)."""
        return self.stop - self.start + len(self.proposals)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One step: the decoding rows, the prefill chunks, and who was preempted to make room."""

    decode: list[Chunk]
    prefill: list[Chunk]
    preempted: list[SequenceState]

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    """Admission, chunked prefill and preemption over a `PageAllocator`.

    Args:
        pages: the page allocator (shared with the engine).
        max_running: the most sequences holding pages at once (the decode program's rows).
        chunk_size: the most tokens one prefilling sequence is fed per step.
        max_prefill_rows: the most prefilling sequences per step.
        recompute_by_decoding: a preempted sequence recomputes its generated tokens one a step among the
            decoding rows rather than in prefill chunks (deterministic mode: the same program computes a
            token's keys and values the first time and again).
        waits_for: ``sequence -> bool``: whether a waiting sequence must not be admitted yet (a sample
            whose first sibling has not written the prompt).
        step_room: ``(sequences, tokens) -> int``: how many more tokens a step of ``sequences`` chunks and
            ``tokens`` tokens can take in one more chunk at no cost (the padding of the program it runs
            in); 0: none. Default: never any.
    """

    def __init__(
        self,
        pages: PageAllocator,
        *,
        max_running: int,
        chunk_size: int,
        max_prefill_rows: int,
        recompute_by_decoding: bool = False,
        waits_for: Callable[[SequenceState], bool] = lambda sequence: False,
        step_room: Callable[[int, int], int] = lambda sequences, tokens: 0,
    ):
        if max_running < 1 or chunk_size < 1 or max_prefill_rows < 1:
            raise ValueError("Scheduler needs max_running, chunk_size and max_prefill_rows of at least 1")
        self.pages = pages
        self.max_running = max_running
        self.chunk_size = chunk_size
        self.max_prefill_rows = max_prefill_rows
        self.recompute_by_decoding = recompute_by_decoding
        self.waits_for = waits_for
        self.step_room = step_room
        self.waiting: list[SequenceState] = []
        self.running: list[SequenceState] = []

    def add(self, sequence: SequenceState) -> None:
        """Queue a new sequence (arrival order)."""
        self.waiting.append(sequence)
        self.waiting.sort(key=lambda s: s.arrival)

    def remove(self, sequence: SequenceState) -> None:
        """Take ``sequence`` out (finished or cancelled) and release its pages at once."""
        if sequence.running:
            self.running.remove(sequence)
            self.pages.release(sequence.key)
            sequence.running = False
        elif sequence in self.waiting:
            self.waiting.remove(sequence)

    def schedule(self) -> Plan:
        """Choose the next step's work (see the module docstring)."""
        preempted: list[SequenceState] = []
        decode: list[Chunk] = []
        prefill: list[Chunk] = []
        for sequence in sorted(self.running, key=operator.attrgetter("arrival")):
            if not sequence.running or sequence.missing == 0:
                continue  # preempted for an older sequence in this loop, or its last token is still drawn
            decoding, stop = self._next_stop(sequence)
            if not decoding and len(prefill) == self.max_prefill_rows:
                continue
            if self._reserve_or_preempt(sequence, stop, preempted):
                (decode if decoding else prefill).append(Chunk(sequence, sequence.computed, stop))
        prefill = [chunk for chunk in prefill if chunk.sequence.running]
        if not preempted:
            self._admit(prefill, preempted)
        if not preempted:
            self._fill(decode, prefill)
        decode = [chunk for chunk in decode if chunk.sequence.running]
        prefill = [chunk for chunk in prefill if chunk.sequence.running]
        return Plan(decode, prefill, preempted)

    def _next_stop(self, sequence: SequenceState, room: int | None = None) -> tuple[bool, int]:
        """``(decoding, stop)``: whether the sequence's next tokens go to the decoding rows, and where its
        next chunk ends (at most ``room`` tokens on, when given). Prompt tokens are prefilled; generated
        tokens are decoded one a step, also when a preempted sequence recomputes them with
        ``recompute_by_decoding`` (so that they go through the same program as the first time); otherwise
        recomputation is prefilled."""
        prompt_left = sequence.computed < sequence.prompt_length
        if prompt_left or (not self.recompute_by_decoding and sequence.missing > 1):
            limit = (
                sequence.prompt_length if prompt_left and self.recompute_by_decoding else len(sequence.tokens)
            )
            size = self.chunk_size if room is None else min(self.chunk_size, room)
            return False, sequence.computed + min(size, limit - sequence.computed)
        return True, sequence.computed + 1

    def _fill(self, decode: list[Chunk], prefill: list[Chunk]) -> None:
        """Add prefill chunks to ``prefill`` while the step's program has room for them (``step_room``):
        first running sequences left out by ``max_prefill_rows``, then waiting ones (fairest first) that
        find a free row and pages; nobody is preempted for them."""
        planned = {id(chunk.sequence) for chunk in decode + prefill}
        tokens = sum(chunk.stop - chunk.start for chunk in decode + prefill)
        for sequence in sorted(self.running, key=operator.attrgetter("arrival")):
            room = self.step_room(len(planned), tokens)
            if room < 1:
                return
            if id(sequence) in planned or sequence.missing == 0:
                continue
            decoding, stop = self._next_stop(sequence, room)
            if decoding or not self._reserve(sequence, stop):
                continue
            prefill.append(Chunk(sequence, sequence.computed, stop))
            planned.add(id(sequence))
            tokens += stop - sequence.computed
        while (room := self.step_room(len(planned), tokens)) > 0:
            admitted = self._admit(prefill, [], room=room)
            if admitted is None:
                return
            planned.add(id(admitted.sequence))
            tokens += admitted.stop - admitted.start

    def _reserve(self, sequence: SequenceState, tokens: int) -> bool:
        """Reserve pages for ``tokens`` tokens of ``sequence`` if there are enough (preempting nobody)."""
        try:
            self.pages.reserve(sequence.key, tokens)
        except OutOfPages:
            return False
        return True

    def _admit(
        self, prefill: list[Chunk], preempted: list[SequenceState], room: int | None = None
    ) -> Chunk | None:
        """Admit waiting sequences, fairest first (see the module docstring), into ``prefill``; fairness
        preemptions go to ``preempted``. With ``room``: one sequence whose chunk is cut to ``room`` tokens,
        past ``max_prefill_rows``, if it finds a free row and pages (preempting nobody). Returns the last
        chunk admitted (None: none)."""
        passed: set[int] = set()  # waiting for a sibling, or just preempted: skipped this step
        admitted = None
        while room is not None or len(prefill) < self.max_prefill_rows:
            candidates = [s for s in self.waiting if id(s) not in passed]
            if not candidates:
                return admitted
            running = Counter(s.caller for s in self.running)
            sequence = min(candidates, key=lambda s: (running[s.caller], s.arrival))
            if self.waits_for(sequence):
                passed.add(id(sequence))
                continue
            shared: list[int] = []
            if sequence.use_prefix_cache:
                limit = min(len(sequence.tokens), sequence.prompt_length) - 1
                shared = self.pages.cached_prefix(sequence.tokens, limit=limit, root=prefix_root(sequence))
            sequence.computed = len(shared) * self.pages.page_size
            decoding, stop = self._next_stop(sequence, room)
            needed = self.pages.pages_for(stop) - len(shared)
            if decoding:
                sequence.computed = 0
                return admitted
            while len(self.running) == self.max_running or needed > self._available_besides(shared):
                victim = None if room is not None else self._fairness_victim(sequence.caller, running)
                if victim is None:
                    sequence.computed = 0
                    return admitted  # nobody overtakes the fairest waiting sequence
                self._preempt(victim)
                preempted.append(victim)
                passed.add(id(victim))  # not readmitted beside the chunk it was planned before this
                running[victim.caller] -= 1  # its pages stay cached: ``shared`` still holds the prefix
            self.pages.add(sequence.key, shared, root=prefix_root(sequence))
            self.pages.reserve(sequence.key, stop)
            sequence.running = True
            self.waiting.remove(sequence)
            self.running.append(sequence)
            admitted = Chunk(sequence, sequence.computed, stop)
            prefill.append(admitted)
            if room is not None:
                return admitted
        return admitted

    def _available_besides(self, shared: list[int]) -> int:
        """Pages a new sequence can take once it holds the cached pages ``shared`` (which stop counting as
        available when nobody else owns them)."""
        return self.pages.available - sum(1 for page in shared if self.pages.references(page) == 0)

    def _fairness_victim(self, caller: Hashable, running: Counter) -> SequenceState | None:
        """The sequence to preempt so that ``caller`` gets a row or pages: the newest of the caller running
        the most, when that caller runs at least two more sequences than ``caller`` (so that the move
        evens them out); None when no caller does."""
        if not self.running:
            return None
        victim = max(self.running, key=lambda s: (running[s.caller], s.arrival))
        return victim if running[victim.caller] >= running[caller] + 2 else None

    def _reserve_or_preempt(
        self, sequence: SequenceState, tokens: int, preempted: list[SequenceState]
    ) -> bool:
        """Reserve pages for ``tokens`` tokens of ``sequence``, preempting the newest sequences of the
        callers running the most while there are too few; False when ``sequence`` itself was preempted."""
        while True:
            try:
                self.pages.reserve(sequence.key, tokens)
                return True
            except OutOfPages:
                running = Counter(s.caller for s in self.running)
                victim = max(self.running, key=lambda s: (running[s.caller], s.arrival))
                self._preempt(victim)
                preempted.append(victim)
                if victim is sequence:
                    return False

    def _preempt(self, sequence: SequenceState) -> None:
        self.running.remove(sequence)
        self.pages.release(sequence.key)
        sequence.running = False
        sequence.computed = 0
        sequence.preemptions += 1
        self.add(sequence)


def prefix_root(sequence: SequenceState) -> int:
    """The prefix cache's root of ``sequence``'s pages: -1 for the base, ``-1 - adapter`` for an adapter's
    (the same tokens under another adapter hold other keys and values)."""
    return -1 - sequence.adapter
