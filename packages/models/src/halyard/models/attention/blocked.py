"""Blocked ("flash-style") attention in pure JAX: memory linear in sequence length.

Queries and keys are cut into blocks. For each query block the kernel walks over the key blocks,
keeping a running maximum, a running softmax denominator and a running weighted sum of values (the
online softmax), so no ``[pos, key_pos]`` matrix larger than one block pair ever exists. The backward
pass is a custom VJP that recomputes each block's probabilities from the saved log-sum-exp instead of
storing them (FlashAttention-2, section 3.1.1).

Two drivers walk the block pairs (`halyard.models.attention.block_pairs`):

- when the mask positions are the default ``0, 1, ...`` (training, prefill) and there are few blocks,
  the pairs that the causal / sliding-window rule can see are known when tracing: only those are
  emitted, unrolled, with no loops and no conditionals;
- otherwise (long sequences, KV-cache decoding) a ``lax.scan`` over blocks skips the pairs in which
  the mask hides every key with ``lax.cond``.

Either way causal attention does about half the work of the full matrix. Inside the kernel blocks are
laid out head-major (``[blocks, B, h, g, q, d]``): every block product is a batched matmul over
contiguous ``[q, d]`` tiles and each loop reads whole leading-axis slices, which keeps XLA from copying
operands into other layouts inside the loops (much faster on CPU than a ``[B, q, h, d]`` layout; benchmarks/README.md).

Shapes inside this file: ``B`` batch, ``Q``/``K`` number of query/key blocks, ``q``/``k`` block sizes,
``h`` kv heads, ``g`` query heads per kv head, ``d`` head size.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Shaped

from halyard.models.attention.block_pairs import (
    BlockTokens,
    Static,
    backward_pairs,
    forward_pairs,
    static_visible_pairs,
)
from halyard.models.attention.layout import FlatAttention

MAX_UNROLLED_PAIRS = 16
"""Up to this many visible block pairs (known when tracing) the kernel is unrolled instead of scanned."""


def blocked_attention(
    flat: FlatAttention, *, scale: float, block_size: int = 128, logit_softcap: float | None = None
) -> Shaped[Array, "batch pos heads head_size"]:
    """Attention of plain-array inputs without materialising the attention matrix.

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        scale: the logit multiplier.
        block_size: the number of queries and of keys per block (shorter sequences use one block);
            lengths that are not a multiple are padded internally.
        logit_softcap: ``cap``: each block's scaled logits become ``cap * tanh(logits / cap)`` before
            the mask (the backward multiplies by ``1 - tanh**2``); None: no capping.

    Returns:
        ``[batch, pos, heads, head_size]``; rows that see no key are zeros.

    Raises:
        ValueError: ``block_size`` is not a positive int.
    """
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"attention: block_size must be a positive int, got {block_size!r}")
    batch, num_queries, num_heads, head_size = flat.query.shape
    num_keys, num_kv_heads = flat.key.shape[1], flat.key.shape[2]
    group = num_heads // num_kv_heads
    query_block = min(block_size, num_queries)
    key_block = min(block_size, num_keys)
    padded_queries = _round_up(num_queries, query_block)
    padded_keys = _round_up(num_keys, key_block)

    def blocks(array: jax.Array, padded: int, block: int, fill: int | bool = 0) -> jax.Array:
        """``[B, S, ...] -> [S/block, B, block, ...]`` (padded with ``fill``)."""
        pad = [(0, 0)] * array.ndim
        pad[1] = (0, padded - array.shape[1])
        array = jnp.pad(array, pad, constant_values=fill)
        array = array.reshape(array.shape[0], padded // block, block, *array.shape[2:])
        return jnp.moveaxis(array, 1, 0)

    # [Q, B, q, h, g, d] -> [Q, B, h, g, q, d]; [K, B, k, h, d] -> [K, B, h, k, d]
    query = blocks(flat.query, padded_queries, query_block)
    query = query.reshape(*query.shape[:3], num_kv_heads, group, head_size).transpose(0, 1, 3, 4, 2, 5)
    key = blocks(flat.key, padded_keys, key_block).transpose(0, 1, 3, 2, 4)
    value = blocks(flat.value, padded_keys, key_block).transpose(0, 1, 3, 2, 4)
    query_segments, key_segments = flat.query_segments, flat.key_segments
    if query_segments is None or key_segments is None:
        query_segments = jnp.zeros_like(flat.query_positions)
        key_segments = jnp.zeros_like(flat.key_positions)
    key_valid = flat.key_valid if flat.key_valid is not None else jnp.ones(flat.key_positions.shape, bool)
    tokens = BlockTokens(
        query_positions=blocks(flat.query_positions, padded_queries, query_block),
        query_segments=blocks(query_segments.astype(jnp.int32), padded_queries, query_block),
        key_positions=blocks(flat.key_positions, padded_keys, key_block),
        key_segments=blocks(key_segments.astype(jnp.int32), padded_keys, key_block),
        key_valid=blocks(key_valid, padded_keys, key_block, fill=False),
    )
    pairs = None
    if flat.default_positions:
        pairs = static_visible_pairs(
            num_queries,
            num_keys,
            query_block,
            key_block,
            causal=flat.causal,
            sliding_window=flat.sliding_window,
        )
        pairs = pairs if len(pairs) <= MAX_UNROLLED_PAIRS else None
    static = Static(
        causal=flat.causal,
        sliding_window=flat.sliding_window,
        scale=float(scale),
        pairs=pairs,
        logit_softcap=None if logit_softcap is None else float(logit_softcap),
    )
    output = _blocked(static, query, key, value, tokens)
    # [Q, B, h, g, q, d] -> [B, Q, q, h, g, d] -> [B, pos, heads, head_size]
    output = output.transpose(1, 0, 4, 2, 3, 5).reshape(batch, padded_queries, num_heads, head_size)
    return output[:, :num_queries]


def _round_up(length: int, block: int) -> int:
    return -(-length // block) * block


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked(
    static: Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: BlockTokens
) -> jax.Array:
    return forward_pairs(static, query, key, value, tokens)[0]


def _blocked_forward(
    static: Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: BlockTokens
) -> tuple[jax.Array, tuple]:
    output, log_sum_exp = forward_pairs(static, query, key, value, tokens)
    return output, (query, key, value, tokens, output, log_sum_exp)


def _blocked_backward(static: Static, residuals: tuple, output_cotangent: jax.Array) -> tuple:
    query, key, value, tokens, output, log_sum_exp = residuals
    query_gradient, key_gradient, value_gradient = backward_pairs(
        static, query, key, value, tokens, output, log_sum_exp, output_cotangent
    )
    return (
        query_gradient.astype(query.dtype),
        key_gradient.astype(key.dtype),
        value_gradient.astype(value.dtype),
        None,
    )


_blocked.defvjp(_blocked_forward, _blocked_backward)
