"""`halyard.serve.row_check`: the probe and the bitwise comparison deterministic mode trusts before it runs a
program of fewer tokens (the engine's use of it: test_deterministic.py)."""

from __future__ import annotations

import numpy as np

from halyard.serve.program import ProgramShape
from halyard.serve.row_check import probe_inputs, results_agree

FULL = ProgramShape(tokens=32, seqs=8, seq_pages=2, prompt_logprobs=True)
SMALL = ProgramShape(tokens=8, seqs=8, seq_pages=2, prompt_logprobs=True)


def _results(pages: np.ndarray, token: np.ndarray, next_logprob: np.ndarray) -> tuple:
    return [pages], (token, token, token, None, None, next_logprob, None, None)


def test_one_bit_anywhere_in_the_compared_sequences_is_a_disagreement() -> None:
    small_inputs, _, _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
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
    small, full, pages = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
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
    again, _, _ = probe_inputs(FULL, SMALL, page_size=16, num_pages=10, vocab=50)
    assert np.array_equal(again.tokens, small.tokens)  # every process builds the same probe
