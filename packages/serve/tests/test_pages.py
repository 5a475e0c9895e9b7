"""The page table, property-tested: after any sequence of arrivals (with prefix-cache hits), growth,
registrations, finishes, cancellations and out-of-pages refusals, no page leaks, reference counts equal
the owners, and every page a sequence reads holds that sequence's own tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.serve.pages import OutOfPages, PageAllocator

PAGE_SIZE = 4


class Simulation:
    """The page table plus what each page would hold if the engine wrote each sequence's tokens."""

    def __init__(self, num_pages: int):
        self.table = PageAllocator(num_pages, PAGE_SIZE)
        self.content: dict[int, list[int | None]] = {p: [None] * PAGE_SIZE for p in range(num_pages)}
        self.tokens: dict[int, list[int]] = {}
        self.written: dict[int, int] = {}

    def arrive(self, owner: int, tokens: list[int]) -> None:
        shared = self.table.cached_prefix(tokens, limit=len(tokens) - 1)
        for index, page in enumerate(shared):  # a cache hit must hold exactly these tokens
            assert self.content[page] == tokens[index * PAGE_SIZE : (index + 1) * PAGE_SIZE]
        self.table.add(owner, shared)
        self.tokens[owner] = tokens
        self.written[owner] = len(shared) * PAGE_SIZE

    def grow(self, owner: int, count: int) -> bool:
        """Write ``count`` more tokens of ``owner`` (reserving pages first); False when out of pages."""
        target = min(self.written[owner] + count, len(self.tokens[owner]))
        try:
            self.table.reserve(owner, target)
        except OutOfPages:
            return False
        pages = self.table.pages_of(owner)
        for position in range(self.written[owner], target):
            page = pages[position // PAGE_SIZE]
            assert self.table.references(page) == 1, "a shared page is written"
            self.content[page][position % PAGE_SIZE] = self.tokens[owner][position]
        self.written[owner] = target
        self.table.register(owner, self.tokens[owner][:target])
        return True

    def leave(self, owner: int) -> None:
        self.table.release(owner)
        del self.tokens[owner], self.written[owner]

    def verify(self) -> None:
        self.table.check()
        for owner, tokens in self.tokens.items():
            pages = self.table.pages_of(owner)
            for position in range(self.written[owner]):
                assert self.content[pages[position // PAGE_SIZE]][position % PAGE_SIZE] == tokens[position]
        expected_in_use = len({p for owner in self.tokens for p in self.table.pages_of(owner)})
        assert self.table.in_use == expected_in_use


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 1, 1], [1, 2, 3, 4, 9, 9, 9, 9, 9], [7] * 13]
operations = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "grow", "leave", "clear"]),
        st.integers(0, 7),  # which sequence
        st.integers(0, len(PROMPTS) - 1),  # which prompt
        st.lists(st.integers(0, 3), min_size=0, max_size=6),  # its continuation
        st.integers(1, 9),  # tokens to write
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(1, 12))
def test_no_leak_and_no_wrong_sharing(steps: list, num_pages: int) -> None:
    simulation = Simulation(num_pages)
    for action, owner, prompt, continuation, count in steps:
        if action == "arrive" and owner not in simulation.tokens:
            simulation.arrive(owner, PROMPTS[prompt] + continuation)
        elif action == "grow" and owner in simulation.tokens:
            available = simulation.table.available
            if not simulation.grow(owner, count):
                assert simulation.table.available == available  # a refusal changes nothing
        elif action == "leave" and owner in simulation.tokens:
            simulation.leave(owner)
        elif action == "clear":
            simulation.table.clear_cache()
        simulation.verify()
    for owner in list(simulation.tokens):
        simulation.leave(owner)
    simulation.verify()
    assert simulation.table.in_use == 0
    simulation.table.clear_cache()
    assert simulation.table.available == num_pages and simulation.table.cached == 0


def test_samples_of_one_prompt_share_its_full_pages() -> None:
    simulation = Simulation(8)
    prompt = list(range(10))  # two full pages and a partial one
    simulation.arrive(0, prompt)
    assert simulation.grow(0, 10)
    for sample in (1, 2):
        simulation.arrive(sample, prompt)
        assert simulation.written[sample] == 8  # the two full pages come from the cache
        assert simulation.grow(sample, 2)  # the partial page is each sample's own
    shared = simulation.table.pages_of(0)[:2]
    assert all(simulation.table.references(p) == 3 for p in shared)
    assert len({simulation.table.pages_of(s)[2] for s in (0, 1, 2)}) == 3
    assert simulation.table.in_use == 5  # live tokens rounded up to pages, shared pages once
    simulation.verify()


def test_the_last_prompt_token_is_never_taken_from_the_cache() -> None:
    simulation = Simulation(4)
    prompt = list(range(8))  # exactly two pages
    simulation.arrive(0, prompt)
    assert simulation.grow(0, 8)
    simulation.leave(0)
    assert (
        simulation.table.cached_prefix(prompt, limit=len(prompt) - 1)
        == simulation.table.cached_prefix(prompt)[:1]
    )


def test_a_cached_page_is_reused_last_and_its_continuations_leave_the_cache() -> None:
    table = PageAllocator(3, PAGE_SIZE)
    table.add("a")
    table.reserve("a", 8)
    table.register("a", list(range(8)))
    table.release("a")
    assert table.available == 3 and table.cached == 2
    table.add("b")
    table.reserve("b", 4)  # takes the free page first
    assert table.cached == 2
    table.reserve("b", 8)  # now the oldest cached page: its continuation leaves the cache too
    assert table.cached == 0
    table.check()
    with pytest.raises(OutOfPages):
        table.reserve("b", 20)
    table.check()


def test_register_looks_again_at_pages_that_left_the_cache() -> None:
    """`register` skips the pages an earlier call cached, unless they have left the cache since."""
    table = PageAllocator(4, PAGE_SIZE)
    table.add("a")
    table.reserve("a", 9)
    tokens = list(range(9))
    table.register("a", tokens, 8)
    assert table.cached == 2
    table.clear_cache()
    assert table.cached == 0
    table.register("a", tokens)  # the same tokens: both full pages go back into the cache
    assert table.cached == 2 and table.cached_prefix(tokens) == table.pages_of("a")[:2]
    table.check()
