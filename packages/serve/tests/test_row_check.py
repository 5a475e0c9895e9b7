"""`halyard.serve.row_check`: the probe and the bitwise comparison that show deterministic mode's programs
batch-invariant (their use over an engine's programs: test_batch_invariance.py)."""

from __future__ import annotations

import numpy as np

from halyard.serve.program import ProgramShape
from halyard.serve.row_check import probe_inputs, results_agree

FULL = ProgramShape(tokens=32, seqs=8, seq_pages=2, prompt_logprobs=True)
SMALL = ProgramShape(tokens=8, seqs=8, seq_pages=2, prompt_logprobs=True)


def _results(pages: np.ndarray, token: np.ndarray, next_logprob: np.ndarray) -> tuple:
    return [pages], (token, token, token, None, None, next_logprob, None, None)


def test_one_bit_anywhere_in_the_compared_sequences_is_a_disagreement() -> None:
    (group, *_), _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
    small_inputs = group.inputs
    seqs = int(small_inputs.batch.num_seqs)
    tokens = int(small_inputs.batch.cu_q_lens[seqs])
    rng = np.random.default_rng(0)
    pages, token = rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    prompt = rng.normal(size=32).astype(np.float32)
    full = _results(pages, token, prompt)
    assert results_agree(_results(pages, token[:8], prompt[:8]), full, small_inputs)
    changed = pages.copy()
    changed[1, 2, 3] = np.nextafter(changed[1, 2, 3], np.float32(np.inf))  # one ulp in a stored value
    assert not results_agree(_results(changed, token, prompt[:8]), full, small_inputs)
    later = token.copy()
    later[seqs - 1] = np.nextafter(later[seqs - 1], np.float32(0))
    assert not results_agree(_results(pages, later, prompt[:8]), full, small_inputs)
    late_prompt = prompt[:8].copy()
    late_prompt[tokens - 1] += 1.0
    assert not results_agree(_results(pages, token, late_prompt), full, small_inputs)
    beyond = token.copy()
    beyond[seqs:] += 1.0  # sequences past the smaller program's are not compared
    assert results_agree(_results(pages, beyond, prompt[:8]), full, small_inputs)


def test_the_probe_mixes_padding_chunks_greedy_and_every_filter_within_the_pages() -> None:
    (group, *_), full = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
    small, pages = group.inputs, group.pages
    seqs = int(small.batch.num_seqs)
    assert 1 <= seqs < SMALL.seqs and small.batch.cu_q_lens[seqs] < SMALL.tokens  # padding left over
    assert int(full.batch.num_seqs) > seqs  # the full program holds more sequences ...
    stored = full.batch.slots[: full.batch.cu_q_lens[int(full.batch.num_seqs)]]
    assert (stored[small.batch.cu_q_lens[seqs] :] == -1).all()  # ... which store nothing
    assert np.array_equal(
        full.tokens[: small.batch.cu_q_lens[seqs]], small.tokens[: small.batch.cu_q_lens[seqs]]
    )
    q_lens = np.diff(full.batch.cu_q_lens[: int(full.batch.num_seqs) + 1])
    assert (q_lens == 1).any() and (q_lens > 1).any()  # decoding tokens and prefill chunks
    assert full.batch.positions.max() < 2 * 16 and (full.tokens < 50).all() and (pages < 10).all()
    settings = full.settings
    assert (settings.temperature == 0).any() and (settings.top_k > 0).any()
    assert (settings.top_p < 1).any() and (settings.min_p > 0).any()
    (again, *_), _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
    assert np.array_equal(again.inputs.tokens, small.tokens)  # every process builds the same probe


def test_one_full_run_holds_several_groups_on_pages_of_their_own() -> None:
    decoding = ProgramShape(tokens=1, seqs=1, seq_pages=2, prompt_logprobs=True)
    groups, full = probe_inputs(FULL, decoding, page_size=16, num_pages=64, vocab=50, rows=6)
    assert len(groups) == 6  # six 1-token runs against one full-size run
    owned = [set(group.pages.tolist()) for group in groups]
    assert sum(map(len, owned)) == len(set().union(*owned))  # no page is two groups'
    stored_until = 0
    for group in groups:
        small = group.inputs
        seqs = int(small.batch.num_seqs)
        tokens = int(small.batch.cu_q_lens[seqs])
        assert group.first_seq == stored_until and group.first_token == full.batch.cu_q_lens[group.first_seq]
        here = slice(group.first_token, group.first_token + tokens)
        assert np.array_equal(full.tokens[here], small.tokens[:tokens])
        assert np.array_equal(full.next_tokens[here], small.next_tokens[:tokens])
        assert np.array_equal(full.batch.positions[here], small.batch.positions[:tokens])
        assert full.settings.seed[group.first_seq].tolist() == small.settings.seed[0].tolist()
        table = full.batch.page_table[group.first_seq : group.first_seq + seqs]
        assert np.array_equal(table, small.batch.page_table[:seqs])
        assert (full.batch.slots[here] >= 0).all()  # every group's sequences store what they compute
        stored_until += seqs
    stored = full.batch.slots[: full.batch.cu_q_lens[int(full.batch.num_seqs)]]
    assert (stored[full.batch.cu_q_lens[stored_until] :] == -1).all()  # the rest store nothing
    (alone,), _ = probe_inputs(FULL, decoding, page_size=16, num_pages=1, vocab=50, rows=6)
    assert int(alone.inputs.batch.num_seqs) == 1  # a pool too small for a second group: one


def test_a_group_compared_at_its_place_in_the_full_programs_outputs() -> None:
    rng = np.random.default_rng(1)
    pages, token = rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    prompt = rng.normal(size=32).astype(np.float32)
    groups, _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=64, vocab=50, rows=8)
    group = groups[-1]
    seqs = int(group.inputs.batch.num_seqs)
    tokens = int(group.inputs.batch.cu_q_lens[seqs])
    full = _results(pages, token, prompt)
    placed = (group.first_seq, group.first_token)
    mine = (
        token[group.first_seq : group.first_seq + seqs],
        prompt[group.first_token : group.first_token + tokens],
    )
    assert results_agree(_results(pages, *mine), full, group.inputs, *placed)
    assert group.first_seq > 0 and not results_agree(_results(pages, *mine), full, group.inputs)


def test_the_padded_tokens_for_the_next_program_are_not_compared() -> None:
    """Every program also outputs its drawn tokens padded to the most sequences (the next program's
    ``previous``): the full program's hold other groups' tokens there, so comparing them would reject every
    smaller program (it did, and deterministic mode ran every step at the most tokens)."""
    (group, *_), _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
    rng = np.random.default_rng(2)
    pages, token = rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    prompt = rng.normal(size=32).astype(np.float32)
    small = ([pages], (*_results(pages, token, prompt[:8])[1], np.arange(8)))
    full = ([pages], (*_results(pages, token, prompt)[1], np.arange(8)[::-1].copy()))
    assert results_agree(small, full, group.inputs)
