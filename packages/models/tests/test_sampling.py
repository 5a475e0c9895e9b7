"""KV-cache decoding against the full forward, and the sampling rules against numpy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import VOCAB, random_tokens, tiny

from halyard.models import init_model
from halyard.models.sampling import SamplingConfig, filter_logits, generate, left_pad
from halyard.named import NamedArray, named


@jax.jit
def _forward(model, tokens: NamedArray) -> jax.Array:
    return model(tokens).unwrap("batch", "pos", "vocab")


def _incremental_logits(model, tokens: NamedArray, prefill: int) -> np.ndarray:
    """Logits from a prefill of ``prefill`` tokens, then one token at a time through the cache."""
    batch, length = tokens.axis_size("batch"), tokens.axis_size("pos")
    cache = model.init_cache(batch, length)
    ones = named(jnp.ones((batch, length), jnp.int32), ("batch", "key_pos"))
    step = jax.jit(
        lambda m, t, c, i, p: m.decode_step(
            t, c, cache_index=i, positions=p, segment_ids=t * 0 + 1, key_segment_ids=ones
        )
    )
    pieces = []
    start = 0
    for stop in [prefill, *range(prefill + 1, length + 1)]:
        chunk = tokens["pos", start:stop]
        positions = named(
            jnp.broadcast_to(jnp.arange(start, stop, dtype=jnp.int32), (batch, stop - start)),
            ("batch", "pos"),
        )
        logits, cache = step(model, chunk, cache, start, positions)
        pieces.append(np.asarray(logits.unwrap("batch", "pos", "vocab")))
        start = stop
    return np.concatenate(pieces, axis=1)


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2", "mixtral", "mup"])
def test_cached_decoding_matches_full_forward(family: str) -> None:
    model = init_model(tiny(family), jax.random.key(1))
    tokens = random_tokens(2, 11)
    full = np.asarray(_forward(model, tokens))
    np.testing.assert_allclose(_incremental_logits(model, tokens, prefill=3), full, atol=1e-5, rtol=1e-5)


def test_greedy_generation_of_prompts_with_different_lengths() -> None:
    model = init_model(tiny("llama"), jax.random.key(2))
    prompts = [[5, 9, 2, 7, 1], [3], [8, 8, 4]]
    result = generate(model, prompts, SamplingConfig(max_new_tokens=4, temperature=0.0), return_logits=True)
    assert result.lengths.tolist() == [4, 4, 4]
    for row, prompt in enumerate(prompts):
        # the full forward of prompt + generated tokens, alone and unpadded, is the reference
        sequence = prompt + result.tokens[row].tolist()
        full = np.asarray(_forward(model, named(jnp.asarray([sequence], jnp.int32), ("batch", "pos"))))[0]
        expected = full[len(prompt) - 1 : len(prompt) + 3]
        np.testing.assert_allclose(np.asarray(result.logits[row]), expected, atol=1e-5, rtol=1e-5)
        assert result.tokens[row].tolist() == np.argmax(expected, axis=-1).tolist()


def test_stop_tokens_end_a_sequence_and_pad_the_rest() -> None:
    model = init_model(tiny("gpt2"), jax.random.key(3))
    prompts = [[1, 2, 3], [4, 5]]
    free = generate(model, prompts, SamplingConfig(max_new_tokens=5, temperature=0.0)).tokens[0].tolist()
    stop = free[1]  # the second greedy token of the first prompt
    result = generate(
        model, prompts, SamplingConfig(max_new_tokens=5, temperature=0.0, stop_tokens=(stop,), pad_token=0)
    )
    first = result.tokens[0].tolist()
    cut = free.index(stop) + 1
    assert first[:cut] == free[:cut] and first[cut:] == [0] * (5 - cut)
    assert int(result.lengths[0]) == cut
    # no stop_tokens given: the model config's eos_token_ids (an imported checkpoint's EOS list) stop it
    with_eos = init_model(tiny("gpt2").replace(eos_token_ids=[10**6, stop]), jax.random.key(3))
    default = generate(with_eos, prompts, SamplingConfig(max_new_tokens=5, temperature=0.0, pad_token=0))
    assert default.tokens[0].tolist() == first
    unstopped = SamplingConfig(max_new_tokens=5, temperature=0.0, stop_tokens=())
    assert generate(with_eos, prompts, unstopped).tokens[0].tolist() == free


def _numpy_filter(logits: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    out = logits.copy()
    if top_k is not None:
        threshold = np.sort(out)[::-1][top_k - 1]
        out[out < threshold] = -np.inf
    if top_p is not None:
        probabilities = np.exp(out - out.max())
        probabilities /= probabilities.sum()
        order = np.argsort(-out, kind="stable")
        total, keep = 0.0, np.zeros(out.shape, bool)
        for index in order:
            if total >= top_p:
                break
            keep[index] = True
            total += probabilities[index]
        out[~keep] = -np.inf
    return out


@pytest.mark.parametrize("top_k,top_p", [(5, None), (None, 0.5), (7, 0.8), (None, 0.999), (1, None)])
def test_filter_logits_matches_numpy(top_k: int | None, top_p: float | None) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 23)).astype(np.float32) * 3
    filtered = np.asarray(filter_logits(jnp.asarray(logits), top_k=top_k, top_p=top_p))
    for row in range(4):
        np.testing.assert_array_equal(
            np.isfinite(filtered[row]), np.isfinite(_numpy_filter(logits[row], top_k, top_p))
        )


def test_sampling_is_reproducible_and_respects_top_k() -> None:
    model = init_model(tiny("llama"), jax.random.key(4))
    config = SamplingConfig(max_new_tokens=6, temperature=1.5, top_k=3)
    first = generate(model, [[1, 2], [3]], config, key=jax.random.key(7), return_logits=True)
    second = generate(model, [[1, 2], [3]], config, key=jax.random.key(7))
    np.testing.assert_array_equal(first.tokens, second.tokens)
    top3 = np.argsort(-np.asarray(first.logits), axis=-1)[..., :3]
    assert all(int(t) in top3[b, i] for b in range(2) for i, t in enumerate(first.tokens[b]))
    assert first.tokens.max() < VOCAB


def test_bad_sampling_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(max_new_tokens=1, top_p=1.5)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        left_pad([[1], []], 0)
    model = init_model(tiny("gpt2"), jax.random.key(0))
    with pytest.raises(ValueError, match="positions"):
        generate(model, [[1] * 60], SamplingConfig(max_new_tokens=10, temperature=0.0))
    with pytest.raises(ValueError, match="PRNG key"):
        generate(model, [[1]], SamplingConfig(max_new_tokens=1))
