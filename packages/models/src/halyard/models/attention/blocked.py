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

from dataclasses import dataclass
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
from halyard.named.nn import invariant_rows

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
    problem = _BlockedProblem.of(flat, scale, block_size, logit_softcap)
    output = _blocked(problem.static, problem.query, problem.key, problem.value, problem.tokens)
    return problem.unblock_queries(output)


def blocked_forward(
    flat: FlatAttention, *, scale: float, block_size: int = 128, logit_softcap: float | None = None
) -> tuple[Shaped[Array, "batch pos heads head_size"], Shaped[Array, "batch pos heads"]]:
    """The forward pass alone: float32 output and its log-sum-exp per query and head (``+inf`` where a
    query sees no key), for kernels that combine partial results over key chunks (ring attention).

    Arguments as for `blocked_attention`.
    """
    problem = _BlockedProblem.of(flat, scale, block_size, logit_softcap)
    output, log_sum_exp = forward_pairs(
        problem.static, problem.query, problem.key, problem.value, problem.tokens
    )
    return problem.unblock_queries(output), problem.unblock_queries(log_sum_exp[..., None])[..., 0]


def blocked_backward(
    flat: FlatAttention,
    output: Shaped[Array, "batch pos heads head_size"],
    log_sum_exp: Shaped[Array, "batch pos heads"],
    output_cotangent: Shaped[Array, "batch pos heads head_size"],
    *,
    scale: float,
    block_size: int = 128,
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Float32 gradients ``(query [B, pos, heads, d], key, value [B, key_pos, kv_heads, d])`` of the
    attention of ``flat``'s queries over ``flat``'s keys, given the final ``output`` and ``log_sum_exp`` of
    those queries (over these keys or over more: ring attention calls it once per key chunk and sums).

    Arguments as for `blocked_forward`.
    """
    problem = _BlockedProblem.of(flat, scale, block_size, logit_softcap)
    output_blocks = problem.block_queries(output)
    sums = problem.block_queries(log_sum_exp[..., None])[..., 0]
    cotangent = problem.block_queries(output_cotangent)
    query_grad, key_grad, value_grad = backward_pairs(
        problem.static,
        problem.query,
        problem.key,
        problem.value,
        problem.tokens,
        output_blocks,
        sums,
        cotangent,
    )
    return (
        problem.unblock_queries(query_grad),
        problem.unblock_keys(key_grad),
        problem.unblock_keys(value_grad),
    )


@dataclass(frozen=True)
class _BlockedProblem:
    """One attention problem cut into head-major blocks, with what it takes to undo the cut."""

    static: Static
    query: jax.Array  # [Q, B, h, g, q, d]
    key: jax.Array  # [K, B, h, k, d]
    value: jax.Array
    tokens: BlockTokens
    num_queries: int
    num_keys: int
    query_block: int
    key_block: int

    @classmethod
    def of(
        cls, flat: FlatAttention, scale: float, block_size: int, logit_softcap: float | None
    ) -> _BlockedProblem:
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"attention: block_size must be a positive int, got {block_size!r}")
        num_queries, num_keys = flat.query.shape[1], flat.key.shape[1]
        query_block, key_block = min(block_size, num_queries), min(block_size, num_keys)
        if invariant_rows() is not None:  # `batch_invariant`: whole key blocks, as an engine's pages are
            key_block = block_size
        padded_queries, padded_keys = _round_up(num_queries, query_block), _round_up(num_keys, key_block)
        num_kv_heads = flat.key.shape[2]
        # [Q, B, q, h, g, d] -> [Q, B, h, g, q, d]; [K, B, k, h, d] -> [K, B, h, k, d]
        query = _blocks(flat.query, padded_queries, query_block)
        query = query.reshape(*query.shape[:3], num_kv_heads, -1, query.shape[-1]).transpose(0, 1, 3, 4, 2, 5)
        key = _blocks(flat.key, padded_keys, key_block).transpose(0, 1, 3, 2, 4)
        value = _blocks(flat.value, padded_keys, key_block).transpose(0, 1, 3, 2, 4)
        query_segments, key_segments = flat.query_segments, flat.key_segments
        if query_segments is None or key_segments is None:
            query_segments = jnp.zeros_like(flat.query_positions)
            key_segments = jnp.zeros_like(flat.key_positions)
        key_valid = flat.key_valid if flat.key_valid is not None else jnp.ones(flat.key_positions.shape, bool)
        tokens = BlockTokens(
            query_positions=_blocks(flat.query_positions, padded_queries, query_block),
            query_segments=_blocks(query_segments.astype(jnp.int32), padded_queries, query_block),
            key_positions=_blocks(flat.key_positions, padded_keys, key_block),
            key_segments=_blocks(key_segments.astype(jnp.int32), padded_keys, key_block),
            key_valid=_blocks(key_valid, padded_keys, key_block, fill=False),
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
        return cls(static, query, key, value, tokens, num_queries, num_keys, query_block, key_block)

    def block_queries(self, array: jax.Array) -> jax.Array:
        """``[B, pos, heads, d]`` -> ``[Q, B, h, g, q, d]``, as the queries are cut."""
        padded = self.query.shape[0] * self.query_block
        blocks = _blocks(array, padded, self.query_block)
        num_kv_heads, group = self.query.shape[2], self.query.shape[3]
        return blocks.reshape(*blocks.shape[:3], num_kv_heads, group, blocks.shape[-1]).transpose(
            0, 1, 3, 4, 2, 5
        )

    def unblock_queries(self, blocks: jax.Array) -> jax.Array:
        """``[Q, B, h, g, q, d]`` -> ``[B, pos, heads, d]`` (padding dropped)."""
        num_blocks, batch, num_kv_heads, group, block, size = blocks.shape
        # [Q, B, h, g, q, d] -> [B, Q, q, h, g, d] -> [B, pos, heads, d]
        flat = blocks.transpose(1, 0, 4, 2, 3, 5).reshape(
            batch, num_blocks * block, num_kv_heads * group, size
        )
        return flat[:, : self.num_queries]

    def unblock_keys(self, blocks: jax.Array) -> jax.Array:
        """``[K, B, h, k, d]`` -> ``[B, key_pos, kv_heads, d]`` (padding dropped)."""
        num_blocks, batch, num_kv_heads, block, size = blocks.shape
        flat = blocks.transpose(1, 0, 3, 2, 4).reshape(batch, num_blocks * block, num_kv_heads, size)
        return flat[:, : self.num_keys]


def _blocks(array: jax.Array, padded: int, block: int, fill: int | bool = 0) -> jax.Array:
    """``[B, S, ...] -> [S/block, B, block, ...]`` (padded with ``fill``)."""
    pad = [(0, 0)] * array.ndim
    pad[1] = (0, padded - array.shape[1])
    array = jnp.pad(array, pad, constant_values=fill)
    array = array.reshape(array.shape[0], padded // block, block, *array.shape[2:])
    return jnp.moveaxis(array, 1, 0)


def _round_up(length: int, block: int) -> int:
    return -(-length // block) * block


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked(
    static: Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: BlockTokens
) -> jax.Array:
    return forward_pairs(static, query, key, value, tokens)[0].astype(query.dtype)


def _blocked_forward(
    static: Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: BlockTokens
) -> tuple[jax.Array, tuple]:
    output, log_sum_exp = forward_pairs(static, query, key, value, tokens)
    output = output.astype(query.dtype)
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
