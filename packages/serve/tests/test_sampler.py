"""Per-row sampling against numpy references of transformers' warpers (temperature, top-k, top-p, min-p in
that order), the draws' frequencies against the filtered distribution, and the keys' independence from the
batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.serve.filters import CANDIDATES, filtered_logits
from halyard.serve.sampler import RowSettings, draw


def _settings(rows: int, **values: list) -> RowSettings:
    defaults = dict(
        temperature=[1.0] * rows, top_k=[0] * rows, top_p=[1.0] * rows, min_p=[0.0] * rows,
        seed=[[0, 7]] * rows, sample=[0] * rows, position=list(range(rows)),
    )  # fmt: skip
    defaults.update(values)
    dtypes = dict(
        temperature=np.float32,
        top_k=np.int32,
        top_p=np.float32,
        min_p=np.float32,
        seed=np.uint32,
        sample=np.int32,
        position=np.int32,
    )
    return RowSettings(
        **{name: jnp.asarray(np.asarray(value, dtypes[name])) for name, value in defaults.items()}
    )


def _kept_reference(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> set[int]:
    """transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, in order."""
    scores = logits.astype(np.float64) / temperature
    if top_k:
        kth = np.sort(scores)[-top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p < 1.0:
        order = np.argsort(scores)  # ascending, as transformers sorts
        probabilities = np.exp(scores[order] - scores.max())
        probabilities /= probabilities.sum()
        removed = np.cumsum(probabilities) <= 1 - top_p
        removed[-1] = False
        scores[order[removed]] = -np.inf
    if min_p > 0.0:
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        scores = np.where(probabilities < min_p * probabilities.max(), -np.inf, scores)
    return set(np.flatnonzero(np.isfinite(scores)).tolist())


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [(1.0, 5, 1.0, 0.0), (0.7, 0, 0.8, 0.0), (1.3, 0, 1.0, 0.2), (0.9, 12, 0.9, 0.05), (1.0, 1, 0.5, 0.5)],
)
def test_the_kept_tokens_are_transformers_warpers_own(
    temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 50)).astype(np.float32) * 2
    settings = _settings(
        6, temperature=[temperature] * 6, top_k=[top_k] * 6, top_p=[top_p] * 6, min_p=[min_p] * 6
    )
    filtered = np.asarray(filtered_logits(jnp.asarray(logits), settings))
    for row in range(6):
        assert set(np.flatnonzero(np.isfinite(filtered[row])).tolist()) == _kept_reference(
            logits[row], temperature, top_k, top_p, min_p
        )
        kept = np.isfinite(filtered[row])
        # one float32 division each (numpy's by the temperature cast to float32): at most a rounding apart
        expected = logits[row][kept] / temperature
        np.testing.assert_allclose(
            filtered[row][kept], expected, rtol=float(np.finfo(np.float32).eps), atol=0
        )


def test_rows_the_candidates_decide_and_rows_that_need_the_whole_sort_are_both_transformers_own() -> None:
    vocab = CANDIDATES + 300
    rng = np.random.default_rng(3)
    peaked = rng.normal(size=vocab) * 2
    peaked[:12] += 12.0  # the candidates hold all but a trace of the mass
    flat = rng.normal(size=vocab) * 0.1  # the nucleus spreads past the candidates
    cases = [  # (logits, temperature, top_k, top_p, min_p, decided by the candidates: keeps none past them)
        (peaked, 1.0, 0, 0.9, 0.0, True),
        (flat, 1.0, 0, 0.9, 0.0, False),
        (flat, 1.0, 40, 1.0, 0.0, True),
        (flat, 1.0, CANDIDATES + 100, 0.95, 0.0, False),
        (flat, 0.8, 0, 1.0, 0.9, True),  # min-p ends inside the candidates
        (flat, 1.0, 0, 1.0, 0.01, False),  # min-p keeps more than the candidates
        (flat, 1.0, 0, 1.0, 0.0, None),  # nothing to filter: every token kept, nothing ranked
        (peaked, 0.7, 300, 0.5, 0.05, True),
    ]
    logits = np.stack([case[0] for case in cases]).astype(np.float32)
    settings = _settings(
        len(cases),
        **{
            name: [case[i + 1] for case in cases]
            for i, name in enumerate(("temperature", "top_k", "top_p", "min_p"))
        },
    )
    filtered = np.asarray(jax.jit(filtered_logits)(jnp.asarray(logits), settings))
    for row, (_, temperature, top_k, top_p, min_p, decided) in enumerate(cases):
        kept = set(np.flatnonzero(np.isfinite(filtered[row])).tolist())
        assert kept == _kept_reference(logits[row], temperature, top_k, top_p, min_p), row
        assert len(kept) <= CANDIDATES if decided else len(kept) > CANDIDATES or decided is None, row
        alone = filtered_logits(
            jnp.asarray(logits[row : row + 1]), RowSettings(*(np.asarray(f)[row : row + 1] for f in settings))
        )
        np.testing.assert_array_equal(
            np.asarray(alone)[0], filtered[row]
        )  # bit for bit, whatever shares the step
    assert any(len(set(np.flatnonzero(np.isfinite(filtered[row])))) > CANDIDATES for row in range(len(cases)))


def test_draws_follow_the_filtered_distribution_and_report_both_logprobs() -> None:
    rng = np.random.default_rng(1)
    row = rng.normal(size=(20,)).astype(np.float32)
    count = 4000
    logits = jnp.asarray(np.tile(row, (count, 1)))
    settings = _settings(count, temperature=[0.8] * count, top_k=[6] * count, top_p=[0.9] * count)
    drawn = draw(logits, settings, 3)
    filtered = np.asarray(filtered_logits(logits[:1], settings))[0]
    expected = np.exp(filtered - filtered[np.isfinite(filtered)].max())
    expected /= expected.sum()
    frequencies = np.bincount(np.asarray(drawn.token), minlength=20) / count
    np.testing.assert_allclose(frequencies, expected, atol=0.03)
    tokens = np.asarray(drawn.token)
    model_logprobs = np.asarray(jax.nn.log_softmax(jnp.asarray(row)))
    # another program's log-softmax of the same 20 logits: their sum, an exp and a log
    bound = summation_tolerance(model_logprobs, row.size + 2 * FUNCTION_TERMS)
    np.testing.assert_allclose(np.asarray(drawn.logprob), model_logprobs[tokens], atol=bound, rtol=0)
    np.testing.assert_allclose(np.asarray(drawn.sampled_logprob), np.log(expected[tokens]), rtol=1e-4)
    assert np.asarray(drawn.top_tokens)[0].tolist() == np.argsort(-row)[:3].tolist()


def test_greedy_rows_take_the_argmax_and_a_rows_key_ignores_the_batch() -> None:
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(4, 30)).astype(np.float32))
    settings = _settings(4, temperature=[0.0, 1.0, 1.0, 1.0], top_p=[1.0, 0.5, 1.0, 1.0])
    drawn = draw(logits, settings, 2)
    assert int(drawn.token[0]) == int(jnp.argmax(logits[0])) and float(drawn.sampled_logprob[0]) == 0.0
    alone = draw(logits[2:3], RowSettings(*(np.asarray(field)[2:3] for field in settings)), 2)
    assert int(alone.token[0]) == int(drawn.token[2])
    assert float(alone.logprob[0]) == float(drawn.logprob[2])
