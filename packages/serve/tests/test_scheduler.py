"""The scheduler's plans (no JAX): every sequence in a step at most once, at the tokens it still lacks."""

from __future__ import annotations

from halyard.serve.pages import PageAllocator
from halyard.serve.scheduler import Scheduler, SequenceState


def test_a_sequence_preempted_for_fairness_is_not_readmitted_in_the_same_step() -> None:
    """Four samples of one request fill the pool, decoding; a request of one sample arrives. The newest
    sample is preempted for it (its caller runs four, the newcomer none). Recomputing by decoding, the
    victim needs one page for its prompt where it freed two: it found room again in the same step, beside
    the decoding chunk it had been planned before (two chunks of one sequence, the first over pages it no
    longer held: an engine failing on its layout, or reading the wrong pages)."""
    pages = PageAllocator(9, 8)
    scheduler = Scheduler(pages, max_running=8, chunk_size=16, max_prefill_rows=2, recompute_by_decoding=True)
    prompt = list(range(12))
    for index in range(4):
        sample = SequenceState(("a", index), "a", prompt + [50 + index] * 10, prompt_length=12, arrival=index)
        pages.add(sample.key, pages.cached_prefix(sample.tokens, limit=11))  # the prompt's first page, shared
        pages.reserve(sample.key, 22)
        pages.register(sample.key, sample.tokens, 21)
        sample.computed, sample.running = 21, True
        scheduler.running.append(sample)
    assert pages.available == 0
    scheduler.add(SequenceState(("b", 0), "b", [1, 2, 3, 4], prompt_length=4, arrival=4))
    plan = scheduler.schedule()
    assert [s.key for s in plan.preempted] == [("a", 3)]
    chunks = [(c.sequence.key, c.start, c.stop) for c in plan.decode + plan.prefill]
    assert chunks == [(("a", 0), 21, 22), (("a", 1), 21, 22), (("a", 2), 21, 22), (("b", 0), 0, 4)]
    assert [s.key for s in scheduler.waiting] == [("a", 3)]
    pages.check()
