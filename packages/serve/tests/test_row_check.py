"""`halyard.serve.row_check`: the probe and the bitwise comparison deterministic mode trusts before it runs a
program of fewer rows (the engine's use of it: test_deterministic.py)."""

from __future__ import annotations

import numpy as np

from halyard.named import named
from halyard.serve.program import ProgramShape
from halyard.serve.row_check import first_rows, probe_inputs, results_agree


def _results(keys: np.ndarray, logprob: np.ndarray) -> tuple:
    written = (named(keys, ("layers", "batch", "key_pos")),)
    return written, (logprob, None)


def test_one_bit_anywhere_in_the_compared_rows_is_a_disagreement() -> None:
    rng = np.random.default_rng(0)
    keys, logprob = rng.normal(size=(2, 8, 3)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    full = _results(keys, logprob)
    assert results_agree(_results(keys[:, :4], logprob[:4]), full, 4)
    changed = keys[:, :4].copy()
    changed[1, 3, 2] = np.nextafter(changed[1, 3, 2], np.float32(np.inf))  # one ulp in a stored value
    assert not results_agree(_results(changed, logprob[:4]), full, 4)
    assert not results_agree(_results(keys[:, :4], np.nextafter(logprob[:4], np.float32(0))), full, 4)
    keys[:, 4:] += 1.0  # rows past the smaller program's are not compared
    assert results_agree(_results(keys[:, :4], logprob[:4]), _results(keys, logprob), 4)


def test_the_probe_mixes_padding_greedy_and_every_filter_within_the_pages() -> None:
    shape = ProgramShape(rows=8, tokens=4, seq_pages=2, prompt_logprobs=True)
    probe = probe_inputs(shape, page_size=16, num_pages=10, vocab=50)
    assert (probe.positions[1] == -1).all() and probe.positions.max() < 2 * 16
    assert (probe.tokens < 50).all() and (probe.page_table < 10).all() and probe.next_tokens is not None
    settings = probe.settings
    assert (settings.temperature == 0).any() and (settings.top_k > 0).any()
    assert (settings.top_p < 1).any() and (settings.min_p > 0).any()
    again = probe_inputs(shape, page_size=16, num_pages=10, vocab=50)
    assert np.array_equal(again.tokens, probe.tokens)  # every process builds the same probe
    small = first_rows(probe, 2)
    assert small.tokens.shape == (2, 4) and small.settings.seed.shape == (2, 2)
