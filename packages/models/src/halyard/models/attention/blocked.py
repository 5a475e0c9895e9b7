"""Blocked ("flash-style") attention in pure JAX: memory linear in sequence length.

Queries and keys are cut into blocks. For each query block the kernel walks over the key blocks,
keeping a running maximum, a running softmax denominator and a running weighted sum of values (the
online softmax), so no ``[pos, key_pos]`` matrix larger than one block pair ever exists. The backward
pass is a custom VJP that recomputes each block's probabilities from the saved log-sum-exp instead of
storing them (FlashAttention-2, section 3.1.1). Block pairs in which the mask hides every key are
skipped with ``lax.cond``, which halves the work of causal attention. A sequence that fits in one
block runs without loops or conditionals, which keeps compile times of short sequences low.

Shapes inside this file: ``B`` batch, ``Q``/``K`` number of query/key blocks, ``q``/``k`` block sizes,
``h`` kv heads, ``g`` query heads per kv head, ``d`` head size.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Shaped

from halyard.models.attention.layout import FlatAttention, visible


class _Tokens(NamedTuple):
    """Per-token mask arrays, padded to whole blocks: ``[B, Q, q]`` for queries, ``[B, K, k]`` for keys."""

    query_positions: jax.Array
    query_segments: jax.Array
    key_positions: jax.Array
    key_segments: jax.Array
    key_valid: jax.Array


class _Static(NamedTuple):
    causal: bool
    sliding_window: int | None
    scale: float


def blocked_attention(
    flat: FlatAttention, *, scale: float, block_size: int = 128
) -> Shaped[Array, "batch pos heads head_size"]:
    """Attention of plain-array inputs without materialising the attention matrix.

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        scale: the logit multiplier.
        block_size: the number of queries and of keys per block (shorter sequences use one block);
            lengths that are not a multiple are padded internally.

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
        pad = [(0, 0)] * array.ndim
        pad[1] = (0, padded - array.shape[1])
        array = jnp.pad(array, pad, constant_values=fill)
        return array.reshape(array.shape[0], padded // block, block, *array.shape[2:])

    query = blocks(flat.query, padded_queries, query_block)
    query = query.reshape(*query.shape[:3], num_kv_heads, group, head_size)
    key = blocks(flat.key, padded_keys, key_block)
    value = blocks(flat.value, padded_keys, key_block)
    query_segments = flat.query_segments
    key_segments = flat.key_segments
    if query_segments is None or key_segments is None:
        query_segments = jnp.zeros_like(flat.query_positions)
        key_segments = jnp.zeros_like(flat.key_positions)
    key_valid = flat.key_valid if flat.key_valid is not None else jnp.ones(flat.key_positions.shape, bool)
    tokens = _Tokens(
        query_positions=blocks(flat.query_positions, padded_queries, query_block),
        query_segments=blocks(query_segments.astype(jnp.int32), padded_queries, query_block),
        key_positions=blocks(flat.key_positions, padded_keys, key_block),
        key_segments=blocks(key_segments.astype(jnp.int32), padded_keys, key_block),
        key_valid=blocks(key_valid, padded_keys, key_block, fill=False),
    )
    static = _Static(causal=flat.causal, sliding_window=flat.sliding_window, scale=float(scale))
    output = _blocked(static, query, key, value, tokens)
    output = output.reshape(batch, padded_queries, num_heads, head_size)
    return output[:, :num_queries]


def _round_up(length: int, block: int) -> int:
    return -(-length // block) * block


def _scan(step: Callable[[Any, jax.Array], tuple[Any, Any]], initial: Any, length: int) -> tuple[Any, Any]:
    """``lax.scan`` over block indices ``0 .. length-1``; one block runs inline (quicker to compile)."""
    if length == 1:
        carry, output = step(initial, jnp.asarray(0))
        return carry, jax.tree.map(lambda leaf: leaf[None], output)
    return jax.lax.scan(step, initial, jnp.arange(length))


def _when_visible(mask: jax.Array, update: Callable, skip: Callable, carry: Any, single_pair: bool) -> Any:
    """``update(carry)`` if any entry of this block pair is visible, else ``skip(carry)``.

    With a single block pair there is nothing to skip, so no conditional is compiled.
    """
    if single_pair:
        return update(carry)
    return jax.lax.cond(jnp.any(mask), update, skip, carry)


def _block_visible(
    static: _Static, tokens: _Tokens, query_index: jax.Array, key_index: jax.Array
) -> jax.Array:
    """The mask of one block pair, ``[B, q, k]``."""
    return visible(
        tokens.query_positions[:, query_index],
        tokens.key_positions[:, key_index],
        tokens.query_segments[:, query_index],
        tokens.key_segments[:, key_index],
        tokens.key_valid[:, key_index],
        causal=static.causal,
        sliding_window=static.sliding_window,
    )


def _logits(
    static: _Static, query_block: Shaped[Array, "B q h g d"], key_block: Shaped[Array, "B k h d"]
) -> Float[Array, "B h g q k"]:
    """``[B, q, h, g, d] x [B, k, h, d] -> [B, h, g, q, k]`` in float32, scaled."""
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", query_block, key_block, preferred_element_type=jnp.float32)
    return logits * static.scale


def _forward(
    static: _Static,
    query: Shaped[Array, "B Q q h g d"],
    key: Shaped[Array, "B K k h d"],
    value: Shaped[Array, "B K k h d"],
    tokens: _Tokens,
) -> tuple[Shaped[Array, "B Q q h g d"], Float[Array, "Q B h g q"]]:
    """Output ``[B, Q, q, h, g, d]`` and log-sum-exp ``[Q, B, h, g, q]`` (``+inf`` for rows seeing nothing)."""
    batch, num_query_blocks, query_block, num_kv_heads, group, head_size = query.shape
    num_key_blocks = key.shape[1]
    single = num_query_blocks == 1 and num_key_blocks == 1

    def one_query_block(query_index: jax.Array) -> tuple[jax.Array, jax.Array]:
        query_block_values = query[:, query_index]
        stats_shape = (batch, num_kv_heads, group, query_block)
        initial = (
            jnp.full(stats_shape, -jnp.inf, jnp.float32),
            jnp.zeros(stats_shape, jnp.float32),
            jnp.zeros((*stats_shape, head_size), jnp.float32),
        )

        def one_key_block(carry: tuple, key_index: jax.Array) -> tuple[tuple, None]:
            mask = _block_visible(static, tokens, query_index, key_index)[:, None, None]

            def update(carry: tuple) -> tuple:
                running_max, denominator, accumulator = carry
                logits = jnp.where(mask, _logits(static, query_block_values, key[:, key_index]), -jnp.inf)
                new_max = jnp.maximum(running_max, logits.max(axis=-1))
                safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
                weights = jnp.exp(logits - safe_max[..., None])
                correction = jnp.exp(running_max - safe_max)
                denominator = denominator * correction + weights.sum(axis=-1)
                block_value = value[:, key_index]
                contribution = jnp.einsum(
                    "bhgqk,bkhd->bhgqd",
                    weights.astype(block_value.dtype),
                    block_value,
                    preferred_element_type=jnp.float32,
                )
                return new_max, denominator, accumulator * correction[..., None] + contribution

            return _when_visible(mask, update, lambda carry: carry, carry, single), None

        (running_max, denominator, accumulator), _ = _scan(one_key_block, initial, num_key_blocks)
        seen = denominator > 0
        output = jnp.where(seen[..., None], accumulator / jnp.where(seen, denominator, 1.0)[..., None], 0.0)
        log_sum_exp = jnp.where(seen, running_max + jnp.log(jnp.where(seen, denominator, 1.0)), jnp.inf)
        return output, log_sum_exp

    output, log_sum_exp = _scan(lambda _, index: (None, one_query_block(index)), None, num_query_blocks)[1]
    # [Q, B, h, g, q, d] -> [B, Q, q, h, g, d]
    output = output.transpose(1, 0, 4, 2, 3, 5).astype(query.dtype)
    return output, log_sum_exp


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked(
    static: _Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: _Tokens
) -> jax.Array:
    return _forward(static, query, key, value, tokens)[0]


def _blocked_forward(
    static: _Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: _Tokens
) -> tuple[jax.Array, tuple]:
    output, log_sum_exp = _forward(static, query, key, value, tokens)
    return output, (query, key, value, tokens, output, log_sum_exp)


def _blocked_backward(static: _Static, residuals: tuple, output_cotangent: jax.Array) -> tuple:
    query, key, value, tokens, output, log_sum_exp = residuals
    num_query_blocks, num_key_blocks = query.shape[1], key.shape[1]
    single = num_query_blocks == 1 and num_key_blocks == 1
    # delta_i = sum_d dO_i * O_i: the softmax backward's row term, [Q, B, h, g, q].
    delta = jnp.einsum(
        "bQqhgd,bQqhgd->Qbhgq",
        output_cotangent.astype(jnp.float32),
        output.astype(jnp.float32),
    )

    def one_key_block(query_gradient: jax.Array, key_index: jax.Array) -> tuple[jax.Array, tuple]:
        key_block_values, value_block_values = key[:, key_index], value[:, key_index]

        def one_query_block(carry: tuple, query_index: jax.Array) -> tuple[tuple, jax.Array]:
            mask = _block_visible(static, tokens, query_index, key_index)[:, None, None]
            query_block_values = query[:, query_index]
            output_gradient = output_cotangent[:, query_index].astype(jnp.float32)

            def update(carry: tuple) -> tuple[tuple, jax.Array]:
                key_gradient, value_gradient = carry
                logits = _logits(static, query_block_values, key_block_values)
                probabilities = jnp.where(mask, jnp.exp(logits - log_sum_exp[query_index][..., None]), 0.0)
                value_gradient = value_gradient + jnp.einsum(
                    "bhgqk,bqhgd->bkhd", probabilities, output_gradient
                )
                probability_gradient = jnp.einsum(
                    "bqhgd,bkhd->bhgqk", output_gradient, value_block_values.astype(jnp.float32)
                )
                logit_gradient = probabilities * (probability_gradient - delta[query_index][..., None])
                logit_gradient = logit_gradient * static.scale
                query_block_gradient = jnp.einsum(
                    "bhgqk,bkhd->bqhgd", logit_gradient, key_block_values.astype(jnp.float32)
                )
                key_gradient = key_gradient + jnp.einsum(
                    "bhgqk,bqhgd->bkhd", logit_gradient, query_block_values.astype(jnp.float32)
                )
                return (key_gradient, value_gradient), query_block_gradient

            def skip(carry: tuple) -> tuple[tuple, jax.Array]:
                return carry, jnp.zeros(query_block_values.shape, jnp.float32)

            return _when_visible(mask, update, skip, carry, single)

        initial = (
            jnp.zeros(key_block_values.shape, jnp.float32),
            jnp.zeros(value_block_values.shape, jnp.float32),
        )
        (key_gradient, value_gradient), query_gradients = _scan(one_query_block, initial, num_query_blocks)
        return query_gradient + query_gradients, (key_gradient, value_gradient)

    query_gradient, (key_gradients, value_gradients) = _scan(
        one_key_block, jnp.zeros((num_query_blocks, *query[:, 0].shape), jnp.float32), num_key_blocks
    )
    # [Q, B, q, h, g, d] -> [B, Q, q, h, g, d]; [K, B, k, h, d] -> [B, K, k, h, d]
    query_gradient = query_gradient.transpose(1, 0, 2, 3, 4, 5).astype(query.dtype)
    key_gradient = key_gradients.transpose(1, 0, 2, 3, 4).astype(key.dtype)
    value_gradient = value_gradients.transpose(1, 0, 2, 3, 4).astype(value.dtype)
    return query_gradient, key_gradient, value_gradient, None


_blocked.defvjp(_blocked_forward, _blocked_backward)
