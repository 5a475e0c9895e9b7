"""The ragged paged kernel interface (`halyard.models.attention.ragged_paged`) and its ``blocked`` kernel:
a flat batch of decoding tokens and prefill chunks, written into a pool and attended, against dense
attention over each sequence's keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import attention_terms, summation_tolerance

from halyard.models.attention.dispatch import paged_kernel
from halyard.models.attention.paged import BlockedPagedKernel
from halyard.models.attention.ragged_paged import ragged_batch, token_sequences

PAGE_SIZE, PAGES, KV_HEADS, HEADS, SIZE = 8, 24, 2, 4, 16


def dense_reference(query, keys, values, positions, *, scale, window=None, cap=None):
    """Attention of ``query [q, Hq, d]`` at ``positions`` over ``keys/values [n, h, d]`` at ``0..n-1``."""
    group = query.shape[1] // keys.shape[1]
    keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
    logits = np.einsum("qhd,khd->hqk", query, keys) * scale
    if cap is not None:
        logits = cap * np.tanh(logits / cap)
    key_positions = np.arange(keys.shape[0])
    seen = key_positions[None, :] <= positions[:, None]
    if window is not None:
        seen &= key_positions[None, :] > positions[:, None] - window
    logits = np.where(seen[None], logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", weights, values)


@pytest.mark.parametrize(
    "window, cap, groups",
    [(None, None, (4, 2)), (5, None, (4, 2)), (None, 3.0, (4, 2)), (None, None, (64, 16))],
)
def test_blocked_kernel_matches_dense_attention_over_a_mixed_batch(window, cap, groups):
    """Groups of 4 single tokens and 2 blocks, or groups larger than the program's 48 tokens (one group)."""
    rng = np.random.default_rng(0)
    # (keys already in pages, new tokens): decoding tokens, a chunk from 0, a chunk after a prefix, padding
    sequences = [(9, 1), (0, 21), (3, 1), (16, 19), (30, 1)]
    kernel = BlockedPagedKernel(query_block=4, group_rows=groups[0], group_blocks=groups[1])
    order = rng.permutation(PAGES)
    tables, taken = [], 0
    for old, new in sequences:
        count = -(-(old + new) // PAGE_SIZE)
        tables.append(order[taken : taken + count].tolist())
        taken += count
    batch = ragged_batch(
        [new for _, new in sequences], [old + new for old, new in sequences], tables,
        page_size=PAGE_SIZE, tokens=48, seqs=8, pages=6,
    )  # fmt: skip
    total = sum(new for _, new in sequences)
    full_keys = [rng.normal(size=(old + new, KV_HEADS, SIZE)).astype(np.float32) for old, new in sequences]
    full_values = [rng.normal(size=(old + new, KV_HEADS, SIZE)).astype(np.float32) for old, new in sequences]
    pool = kernel.init_pool(2, PAGES, PAGE_SIZE, KV_HEADS, SIZE, jnp.float32)
    # the keys already there, written as earlier steps would have
    for (old, _), table, k, v in zip(sequences, tables, full_keys, full_values):
        if old:
            slots = np.asarray([table[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in range(old)])
            pool = kernel.write(pool, jnp.int32(1), k[:old], v[:old], jnp.asarray(slots, jnp.int32))
    new_keys = np.zeros((48, KV_HEADS, SIZE), np.float32)
    new_values = np.zeros((48, KV_HEADS, SIZE), np.float32)
    start = 0
    for (old, new), k, v in zip(sequences, full_keys, full_values):
        new_keys[start : start + new], new_values[start : start + new] = k[old:], v[old:]
        start += new
    query = rng.normal(size=(48, HEADS, SIZE)).astype(np.float32)

    @jax.jit
    def step(pool, query, keys, values, batch):
        pool = kernel.write(pool, jnp.int32(1), keys, values, batch.slots)
        layout = (batch.page_table, batch.cu_q_lens, batch.kv_lens, batch.num_seqs)
        step = kernel.prepare(pool, *layout, tokens=query.shape[0])
        return kernel.attend(
            query, pool, jnp.int32(1), step, scale=0.3, sliding_window=window, logit_softcap=cap
        )  # fmt: skip

    output = np.asarray(step(pool, query, new_keys, new_values, jax.tree.map(jnp.asarray, batch)))
    start = 0
    for (old, new), k, v in zip(sequences, full_keys, full_values):
        positions = np.arange(old, old + new)
        expected = dense_reference(
            query[start : start + new], k, v, positions, scale=0.3, window=window, cap=cap
        )
        # float32 attention in two orders (numpy's einsums are float32 too): each page a key block
        terms = attention_terms(SIZE, old + new, key_blocks=-(-(old + new) // PAGE_SIZE))
        bound = summation_tolerance(expected, terms)
        np.testing.assert_allclose(output[start : start + new], expected, atol=bound, rtol=0)
        start += new
    assert start == total


def test_single_tokens_are_grouped_longest_first():
    """Decoding tokens at positions 2, 39 and 16 and a chunk of positions 7 and 8 (pages of 8): the rows
    reading 5, 3, 2 pages, then the two reading 1 in flat order, then padding (the program's 8 tokens)."""
    batch = ragged_batch(
        [1, 1, 1, 2], [3, 40, 17, 9], [[0], [1, 2, 3, 4, 5], [6, 7, 8], [9, 10]],
        page_size=8, tokens=8, seqs=4, pages=5,
    )  # fmt: skip
    kernel = BlockedPagedKernel(query_block=4)
    pool = kernel.init_pool(1, 11, 8, KV_HEADS, SIZE, jnp.float32)
    layout = (batch.page_table, batch.cu_q_lens, batch.kv_lens, batch.num_seqs)
    step = kernel.prepare(pool, *(jnp.asarray(a) for a in layout), tokens=8)
    assert np.asarray(step.singles)[:, 0].tolist() == [1, 2, 4, 0, 3, 8, 8, 8]


def test_token_sequences_gives_each_token_its_sequence_and_position():
    batch = ragged_batch([1, 3], [5, 3], [[0], [1]], page_size=8, tokens=6, seqs=3, pages=1)
    sequence, positions = token_sequences(
        jnp.asarray(batch.cu_q_lens), jnp.asarray(batch.kv_lens), jnp.asarray(batch.num_seqs), 6
    )
    assert np.asarray(positions).tolist() == [4, 0, 1, 2, -1, -1] == batch.positions.tolist()
    assert np.asarray(sequence)[:4].tolist() == [0, 1, 1, 1]
    assert batch.slots.tolist() == [4, 8, 9, 10, -1, -1]


def test_ragged_batch_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="exceed 1 slots"):
        ragged_batch([1, 1], [1, 1], [[0], [1]], page_size=4, tokens=4, seqs=1, pages=1)
    with pytest.raises(ValueError, match="sequence 0 has q_len 2, kv_len 9 and 1 pages"):
        ragged_batch([2], [9], [[0]], page_size=4, tokens=4, seqs=1, pages=3)


def test_paged_kernel_choices():
    assert isinstance(paged_kernel("auto", backend="cpu"), BlockedPagedKernel)
    assert isinstance(paged_kernel("blocked", backend="tpu"), BlockedPagedKernel)
    assert type(paged_kernel("auto", backend="tpu")).__name__ == "PallasPagedKernel"
    assert type(paged_kernel("pallas", backend="cpu")).__name__ == "PallasPagedKernel"
    with pytest.raises(ValueError, match="unknown implementation 'flash'"):
        paged_kernel("flash")
