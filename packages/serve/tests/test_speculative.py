"""Speculative decoding in the engine (`halyard.serve.speculation`): prompt lookup's proposals; greedy and
seeded output equal to the unspeculated engine's token for token; the target distribution kept (a
chi-square test of a token drawn after accepted and rejected proposals, against the exact marginal from
the full forward); pages of rejected tokens given back; deterministic mode bitwise alone and batched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats
from tiny_models import VOCAB, tiny_model

from halyard.named import named
from halyard.serve import Engine, EngineConfig, SamplingParams
from halyard.serve.speculation import ngram_proposal

SIZES = dict(page_size=8, num_pages=96, max_context=64, max_running=8, chunk_size=16, max_prefill_rows=2)
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2],  # a prompt that repeats: most proposals hit
    [9, 8, 7, 9, 8, 7, 9],
    [5, 5, 5],
    [11, 12, 13, 14, 15, 16, 17, 18, 11, 12, 13],
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def engines(model) -> dict[str, Engine]:
    """Engines without and with prompt lookup (3 tokens a step), compiled once for the module."""
    return {
        spec: Engine(model, EngineConfig(**SIZES, speculative=spec, speculative_tokens=3))
        for spec in ("none", "ngram")
    }


def test_ngram_proposal() -> None:
    assert ngram_proposal([1, 2, 3, 9, 1, 2, 3], 4) == (9, 1, 2, 3)  # the latest occurrence of "1 2 3"
    assert ngram_proposal([1, 2, 8, 1, 2, 9, 1, 2], 2) == (9, 1)  # the latest of two earlier "1 2"s
    assert ngram_proposal([1, 2, 1, 2], 5) == (1, 2, 1, 2, 1)  # continued periodically past the end
    assert ngram_proposal([7, 7, 7], 3) == (7, 7, 7)
    assert ngram_proposal([1, 2, 3, 4], 2) == ()  # nothing occurs twice
    assert ngram_proposal([3, 1, 2, 3], 0) == ()


def tokens_of(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [sample.token_ids for out in engine.generate(prompts, params) for sample in out.samples]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_equals_unspeculated(engines: dict[str, Engine], temperature: float) -> None:
    """Greedy and seeded sampling (n=2, top-k): the same tokens with and without proposals; some proposals
    are accepted, some rejected, and every page comes back."""
    params = SamplingParams(max_tokens=20, temperature=temperature, top_k=20, seed=5, n=2, ignore_eos=True)
    expected = tokens_of(engines["none"], PROMPTS, params)
    speculative = engines["ngram"]
    proposed, accepted = speculative.stats.tokens_proposed, speculative.stats.tokens_accepted
    assert tokens_of(speculative, PROMPTS, params) == expected
    proposed, accepted = (
        speculative.stats.tokens_proposed - proposed,
        speculative.stats.tokens_accepted - accepted,
    )
    assert 0 < accepted < proposed
    assert speculative.pages.in_use == 0
    speculative.pages.check()


def test_logprobs_and_lengths(engines: dict[str, Engine]) -> None:
    """A step that emits several tokens reports a log-prob and alternatives for each, and stops at
    ``max_tokens`` and at a stop token inside the tokens it accepted."""
    params = SamplingParams(max_tokens=13, temperature=0.0, logprobs=True, top_logprobs=2, ignore_eos=True)
    (expected,) = engines["none"].generate(PROMPTS[:1], params)
    (got,) = engines["ngram"].generate(PROMPTS[:1], params)
    assert got.samples[0].token_ids == expected.samples[0].token_ids and len(got.samples[0].token_ids) == 13
    np.testing.assert_allclose(got.samples[0].logprobs, expected.samples[0].logprobs, atol=1e-5, rtol=0)
    assert [[t for t, _ in top] for top in got.samples[0].top_logprobs] == [
        [t for t, _ in top] for top in expected.samples[0].top_logprobs
    ]
    stop = expected.samples[0].token_ids[6]
    first = expected.samples[0].token_ids.index(stop)
    stopping = SamplingParams(max_tokens=13, temperature=0.0, stop_token_ids=(stop,))
    (ended,) = engines["ngram"].generate(PROMPTS[:1], stopping)
    assert ended.samples[0].token_ids == expected.samples[0].token_ids[: first + 1]
    assert ended.samples[0].finish_reason == "stop"


def test_keeps_the_target_distribution(model, engines: dict[str, Engine]) -> None:
    """The third token drawn (after a prompt whose lookup proposes two tokens: one step verifies them) over
    1024 samples at temperature 1, against its exact marginal from the full forward pass (a chi-square test);
    the step rejected some proposals and accepted others."""
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    engine = engines["ngram"]
    proposed, accepted = engine.stats.tokens_proposed, engine.stats.tokens_accepted
    params = [SamplingParams(max_tokens=3, temperature=1.0, n=32, seed=seed) for seed in range(32)]
    drawn = [tokens[2] for tokens in tokens_of(engine, [prompt] * 32, params)]
    assert 0 < engine.stats.tokens_accepted - accepted < engine.stats.tokens_proposed - proposed
    marginal = third_token_marginal(model, prompt).astype(np.float64)
    expected = marginal / marginal.sum() * len(drawn)
    observed = np.bincount(drawn, minlength=VOCAB)
    common = expected >= 5  # the rare tokens pooled into one category
    observed = np.append(observed[common], observed[~common].sum())
    expected = np.append(expected[common], expected[~common].sum())
    assert scipy_stats.chisquare(observed, expected).pvalue > 1e-3


def third_token_marginal(model, prompt: list[int]) -> np.ndarray:
    """``P(t3)`` after ``prompt``: the sum over the first two tokens of the full forward's probabilities."""

    @jax.jit
    def probabilities(tokens: jax.Array) -> jax.Array:
        logits = model(named(tokens, ("batch", "pos"))).unwrap("batch", "pos", "vocab")
        return jax.nn.softmax(logits[:, -1], axis=-1)

    first = np.asarray(probabilities(jnp.asarray([prompt])))[0]
    pairs = np.asarray([[*prompt, a] for a in range(VOCAB)])
    second = np.asarray(probabilities(jnp.asarray(pairs)))  # [t1, t2]
    triples = np.asarray([[*prompt, a, b] for a in range(VOCAB) for b in range(VOCAB)])
    third = np.asarray(probabilities(jnp.asarray(triples))).reshape(VOCAB, VOCAB, VOCAB)
    return np.einsum("a,ab,abc->c", first, second, third)


def test_deterministic_mode_is_bitwise(model) -> None:
    """Deterministic mode with prompt lookup: a request's tokens and log-probs are the same bits alone and
    beside others; its tokens are those of deterministic mode without speculation (whose programs hold
    fewer tokens, so its log-probs round differently)."""
    fixed = dict(SIZES, deterministic=True, min_rows=64)  # one program size: no row checks to compile
    plain = Engine(model, EngineConfig(**fixed))
    speculative = Engine(model, EngineConfig(**fixed, speculative="ngram", speculative_tokens=3))
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=7, logprobs=True, ignore_eos=True)
    (alone,) = speculative.generate(PROMPTS[:1], params)
    batched = speculative.generate(PROMPTS[1:] + PROMPTS[:1], params)[-1]
    assert batched.samples[0].token_ids == alone.samples[0].token_ids
    assert batched.samples[0].logprobs == alone.samples[0].logprobs
    assert speculative.stats.tokens_accepted > 0
    (unspeculated,) = plain.generate(PROMPTS[:1], params)
    assert unspeculated.samples[0].token_ids == alone.samples[0].token_ids
    np.testing.assert_allclose(unspeculated.samples[0].logprobs, alone.samples[0].logprobs, atol=1e-5, rtol=0)


def perturbed(model, scale: float):
    """``model`` with each weight multiplied by ``1 + scale * N(0, 1)`` (a draft that mostly agrees)."""
    leaves, tree = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    changed = [
        x * (1 + scale * jax.random.normal(key, x.shape, x.dtype))
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
        else x
        for x, key in zip(leaves, keys)
    ]
    return jax.tree.unflatten(tree, changed)


@pytest.mark.parametrize("draft_seed", [0, 1])
def test_draft_model(model, engines: dict[str, Engine], draft_seed: int) -> None:
    """A draft model's proposals (the target itself: every proposal kept; the target's weights perturbed:
    some): the same tokens as without speculation, greedy and seeded, and every page of both pools back."""
    draft = model if draft_seed == 0 else perturbed(model, 0.3)
    engine = Engine(model, EngineConfig(**SIZES, speculative="draft", speculative_tokens=3), draft=draft)
    plain = engines["none"]
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_tokens=12, temperature=temperature, seed=3, n=2, ignore_eos=True)
        proposed, accepted = engine.stats.tokens_proposed, engine.stats.tokens_accepted
        assert tokens_of(engine, PROMPTS, params) == tokens_of(plain, PROMPTS, params)
        proposed, accepted = engine.stats.tokens_proposed - proposed, engine.stats.tokens_accepted - accepted
        if draft_seed == 0:  # the target's own draws with the same keys: every proposal kept, sampled too
            assert accepted == proposed > 0
        else:
            assert 0 < accepted < proposed
    assert engine.pages.in_use == 0
    engine.proposer.propose([], [], [])  # forgets the ended sequences
    assert engine.proposer.pages.in_use == 0
