"""Random masks (segments, padding, positions) through every implementation: all agree with `reference`.

With a logit soft-cap (Gemma 2) only the implementations that support one (`CAPPED`) are compared.

Shapes are fixed and every mask array is always present, so each mask-flag combination compiles once
and hypothesis varies only the data.
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import attention_terms, summation_tolerance
from hypothesis import given, settings

from halyard.models.attention import AttentionMask, attention
from halyard.named import NamedArray, named

BATCH, NUM_QUERIES, NUM_KEYS, HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 2, 7, 9, 4, 2, 8, 4
COMPARED = ("xla", "blocked")
CAPPED = ("blocked",)


def _compared(logit_softcap: float | None) -> tuple[str, ...]:
    return COMPARED if logit_softcap is None else CAPPED


@functools.cache
def _all_implementations(causal: bool, window: int | None, logit_softcap: float | None):
    """One compiled program: values and q/k/v gradients of reference and the compared implementations."""

    def run(query: NamedArray, key: NamedArray, value: NamedArray, mask: AttentionMask, cotangent: jax.Array):
        results = {}
        for implementation in ("reference", *_compared(logit_softcap)):

            def loss(
                query: NamedArray, key: NamedArray, value: NamedArray, implementation: str = implementation
            ):
                output = attention(
                    query,
                    key,
                    value,
                    mask,
                    implementation=implementation,
                    block_size=BLOCK,
                    logit_softcap=logit_softcap,
                )
                return jnp.sum(output.array * cotangent), output.array

            (_, output), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(query, key, value)
            results[implementation] = (output, *(g.array for g in grads))
        return results

    return jax.jit(run)


@settings(max_examples=15, deadline=None)
@given(
    # (causal, sliding window, logit soft-cap)
    flags=st.sampled_from(
        [(True, None, None), (True, 3, None), (False, None, None), (True, 3, 1.5), (False, None, 1.5)]
    ),
    seed=st.integers(0, 2**31 - 1),
    num_segments=st.integers(1, 3),
    padding_probability=st.sampled_from([0.0, 0.3]),
)
def test_random_masks_agree_with_reference(
    flags: tuple[bool, int | None, float | None], seed: int, num_segments: int, padding_probability: float
) -> None:
    causal, window, logit_softcap = flags
    rng = np.random.default_rng(seed)
    query_positions = np.sort(rng.choice(12, size=(BATCH, NUM_QUERIES), replace=True), axis=1)
    mask = AttentionMask(
        causal=causal,
        sliding_window=window,
        segment_ids=named(jnp.asarray(rng.integers(0, num_segments, (BATCH, NUM_QUERIES))), ("batch", "pos")),
        key_segment_ids=named(
            jnp.asarray(rng.integers(0, num_segments, (BATCH, NUM_KEYS))), ("batch", "key_pos")
        ),
        query_positions=named(jnp.asarray(query_positions), ("batch", "pos")),
        key_positions=named(jnp.asarray(np.tile(np.arange(NUM_KEYS), (BATCH, 1))), ("batch", "key_pos")),
        key_valid=named(
            jnp.asarray(rng.random((BATCH, NUM_KEYS)) >= padding_probability), ("batch", "key_pos")
        ),
    )
    query = named(
        jnp.asarray(rng.normal(size=(BATCH, NUM_QUERIES, HEADS, HEAD_SIZE)), jnp.float32),
        ("batch", "pos", "heads", "head_size"),
    )
    key = named(
        jnp.asarray(rng.normal(size=(BATCH, NUM_KEYS, KV_HEADS, HEAD_SIZE)), jnp.float32),
        ("batch", "key_pos", "kv_heads", "head_size"),
    )
    value = named(
        jnp.asarray(rng.normal(size=(BATCH, NUM_KEYS, KV_HEADS, HEAD_SIZE)), jnp.float32),
        ("batch", "key_pos", "kv_heads", "head_size"),
    )
    cotangent = jnp.asarray(rng.normal(size=(BATCH, NUM_QUERIES, HEADS, HEAD_SIZE)), jnp.float32)
    results = _all_implementations(causal, window, logit_softcap)(query, key, value, mask, cotangent)
    for implementation in _compared(logit_softcap):
        for name, got, want in zip(
            ("output", "dq", "dk", "dv"), results[implementation], results["reference"]
        ):
            queries_per_key = 0 if name == "output" else NUM_QUERIES * HEADS // KV_HEADS
            terms = attention_terms(HEAD_SIZE, NUM_KEYS, -(-NUM_KEYS // BLOCK), queries_per_key)
            # a gradient's addends (a cotangent times two of q, k, v) cancel: bound at their size
            largest = max(float(jnp.abs(x.array).max()) for x in (query, key, value))
            size = want if name == "output" else float(jnp.abs(cotangent).max()) * largest**2
            bound = summation_tolerance(size, terms)
            np.testing.assert_allclose(got, want, atol=bound, rtol=0, err_msg=f"{implementation} {name}")
    # Rows that see no key at all are exactly zero.
    visible = np.broadcast_to(
        np.asarray(mask.materialize(query.axis("pos"), key.axis("key_pos")).array),
        (BATCH, NUM_QUERIES, NUM_KEYS),
    )
    empty = ~visible.any(-1)
    for implementation in ("reference", *_compared(logit_softcap)):
        assert np.all(np.asarray(results[implementation][0])[empty] == 0)
