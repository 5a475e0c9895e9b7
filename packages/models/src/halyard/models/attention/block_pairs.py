"""The block-pair arithmetic of `blocked_attention`: online-softmax forward and recomputing backward.

Arrays here are head-major blocks: ``query[Q, B, h, g, q, d]``, ``key/value[K, B, h, k, d]``, per-token
mask arrays ``[Q, B, q]`` / ``[K, B, k]``, log-sum-exp ``[Q, B, h, g, q]`` (see `blocked` for the names).
Each pass has two drivers over the same per-pair functions: an unrolled one over the pairs listed in
`Static.pairs` (known when tracing), and a scanned one that visits every pair and skips those in which
the mask hides every key with ``lax.cond``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from halyard.models.attention.layout import visible
from halyard.models.attention.softcap import soft_cap, soft_cap_derivative
from halyard.named.nn import row_sum


class BlockTokens(NamedTuple):
    """Per-token mask arrays in blocks: ``[Q, B, q]`` for queries, ``[K, B, k]`` for keys."""

    query_positions: jax.Array
    query_segments: jax.Array
    key_positions: jax.Array
    key_segments: jax.Array
    key_valid: jax.Array


class Static(NamedTuple):
    """Trace-time settings: the mask flags, the logit scale and cap, and the visible pairs when known.

    ``pairs`` lists ``(query_block, key_block)`` in query-major order, or is None (scan every pair);
    ``logit_softcap`` is None for uncapped logits.
    """

    causal: bool
    sliding_window: int | None
    scale: float
    pairs: tuple[tuple[int, int], ...] | None
    logit_softcap: float | None = None


def static_visible_pairs(
    num_queries: int,
    num_keys: int,
    query_block: int,
    key_block: int,
    *,
    causal: bool,
    sliding_window: int | None,
) -> tuple[tuple[int, int], ...]:
    """Block pairs that can hold a visible key when positions are ``0, 1, ...`` for queries and keys.

    Args:
        num_queries, num_keys: unpadded lengths.
        query_block, key_block: block sizes.
        causal, sliding_window: the mask's position rules (segments and key validity only hide more,
            so they are applied inside each pair).

    Returns:
        ``(query_block_index, key_block_index)`` pairs in query-major order.
    """
    pairs = []
    for query_index in range(-(-num_queries // query_block)):
        first_query = query_index * query_block
        last_query = min(first_query + query_block, num_queries) - 1
        for key_index in range(-(-num_keys // key_block)):
            first_key = key_index * key_block
            last_key = min(first_key + key_block, num_keys) - 1
            if causal and first_key > last_query:
                continue
            if sliding_window is not None and last_key <= first_query - sliding_window:
                continue
            pairs.append((query_index, key_index))
    return tuple(pairs)


def _mask(
    static: Static, tokens: BlockTokens, query_index: jax.Array | int, key_index: jax.Array | int
) -> jax.Array:
    """The visibility of one block pair, ``[B, 1, 1, q, k]`` (broadcasts over heads)."""
    return visible(
        tokens.query_positions[query_index],
        tokens.key_positions[key_index],
        tokens.query_segments[query_index],
        tokens.key_segments[key_index],
        tokens.key_valid[key_index],
        causal=static.causal,
        sliding_window=static.sliding_window,
    )[:, None, None]


def _logits(static: Static, query: jax.Array, key: jax.Array, keys_by_size: bool = False) -> jax.Array:
    """``[B, h, g, q, d] x [B, h, k, d] -> [B, h, g, q, k]`` in float32, scaled (and soft-capped); with
    ``keys_by_size`` the keys come as ``[B, h, d, k]`` (the same products)."""
    spec = "bhgqd,bhdk->bhgqk" if keys_by_size else "bhgqd,bhkd->bhgqk"
    logits = jnp.einsum(spec, query, key, preferred_element_type=jnp.float32)
    logits = logits * static.scale
    if static.logit_softcap is not None:
        logits = soft_cap(logits, static.logit_softcap)
    return logits


Running = tuple[jax.Array, jax.Array, jax.Array]
"""Online-softmax state of one query block: running max, denominator ``[B, h, g, q]``, sum ``[..., d]``."""


def initial_state(query_block: jax.Array) -> Running:
    """The empty state of a query block ``[B, h, g, q, d]``."""
    stats_shape = query_block.shape[:-1]
    return (
        jnp.full(stats_shape, -jnp.inf, jnp.float32),
        jnp.zeros(stats_shape, jnp.float32),
        jnp.zeros(query_block.shape, jnp.float32),
    )


def attend_block(
    static: Static,
    state: Running,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    keys_by_size: bool = False,
) -> Running:
    """Fold one key block into a query block's online softmax (``keys_by_size``: see `_logits`). Public: the paged kernel (`halyard.models.attention.paged`) folds pages with it."""
    running_max, denominator, accumulator = state
    logits = jnp.where(mask, _logits(static, query, key, keys_by_size), -jnp.inf)
    new_max = jnp.maximum(running_max, logits.max(axis=-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    weights = jnp.exp(logits - safe_max[..., None])
    correction = jnp.exp(running_max - safe_max)
    denominator = denominator * correction + row_sum(weights)  # fixed order in batch_invariant
    contribution = jnp.einsum(
        "bhgqk,bhkd->bhgqd", weights.astype(value.dtype), value, preferred_element_type=jnp.float32
    )
    return new_max, denominator, accumulator * correction[..., None] + contribution


def finish_state(state: Running) -> tuple[jax.Array, jax.Array]:
    """``(output [B, h, g, q, d], log-sum-exp [B, h, g, q])``; rows that saw nothing give 0 and +inf."""
    running_max, denominator, accumulator = state
    seen = denominator > 0
    output = jnp.where(seen[..., None], accumulator / jnp.where(seen, denominator, 1.0)[..., None], 0.0)
    log_sum_exp = jnp.where(seen, running_max + jnp.log(jnp.where(seen, denominator, 1.0)), jnp.inf)
    return output, log_sum_exp


def _tied(arrays: tuple) -> tuple:
    """``arrays`` unchanged, but each now depends on all of them.

    Inside a scan over layers the block tokens (positions, segment ids) are the same for every layer, and
    JAX's scan partial evaluation hoists whatever depends on them alone out of the loop, as residuals:
    here, every block pair's mask and masked logits, stacked for all pairs (memory quadratic in the
    sequence). Tied to the queries, nothing in the kernel is loop-invariant.
    """
    return jax.lax.optimization_barrier(arrays)


def forward_pairs(
    static: Static, query: jax.Array, key: jax.Array, value: jax.Array, tokens: BlockTokens
) -> tuple[jax.Array, jax.Array]:
    """Output ``[Q, B, h, g, q, d]`` and log-sum-exp ``[Q, B, h, g, q]``, both float32."""
    query, key, value, tokens = _tied((query, key, value, tokens))
    if static.pairs is not None:
        outputs, sums = [], []
        for query_index in range(query.shape[0]):
            state = initial_state(query[query_index])
            for key_index in (k for q, k in static.pairs if q == query_index):
                mask = _mask(static, tokens, query_index, key_index)
                state = attend_block(
                    static, state, query[query_index], key[key_index], value[key_index], mask
                )
            output, log_sum_exp = finish_state(state)
            outputs.append(output)
            sums.append(log_sum_exp)
        return jnp.stack(outputs), jnp.stack(sums)

    def one_query_block(query_index: jax.Array, query_block: jax.Array) -> tuple[jax.Array, jax.Array]:
        def one_key_block(state: Running, key_index: jax.Array) -> tuple[Running, None]:
            mask = _mask(static, tokens, query_index, key_index)

            def update(state: Running) -> Running:
                return attend_block(static, state, query_block, key[key_index], value[key_index], mask)

            return jax.lax.cond(jnp.any(mask), update, lambda state: state, state), None

        state, _ = jax.lax.scan(one_key_block, initial_state(query_block), jnp.arange(key.shape[0]))
        return finish_state(state)

    def body(_: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, tuple[jax.Array, jax.Array]]:
        return None, one_query_block(*xs)

    _, (output, log_sum_exp) = jax.lax.scan(body, None, (jnp.arange(query.shape[0]), query))
    return output, log_sum_exp


def _pair_gradients(
    static: Static,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    output_gradient: jax.Array,
    log_sum_exp: jax.Array,
    delta: jax.Array,
    mask: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One pair's contributions ``(d query [B, h, g, q, d], d key, d value [B, h, k, d])`` in float32."""
    logits = _logits(static, query, key)
    probabilities = jnp.where(mask, jnp.exp(logits - log_sum_exp[..., None]), 0.0)
    value_gradient = jnp.einsum("bhgqk,bhgqd->bhkd", probabilities, output_gradient)
    probability_gradient = jnp.einsum("bhgqd,bhkd->bhgqk", output_gradient, value.astype(jnp.float32))
    logit_gradient = probabilities * (probability_gradient - delta[..., None]) * static.scale
    if static.logit_softcap is not None:
        logit_gradient = logit_gradient * soft_cap_derivative(logits, static.logit_softcap)
    query_gradient = jnp.einsum("bhgqk,bhkd->bhgqd", logit_gradient, key.astype(jnp.float32))
    key_gradient = jnp.einsum("bhgqk,bhgqd->bhkd", logit_gradient, query.astype(jnp.float32))
    return query_gradient, key_gradient, value_gradient


def backward_pairs(
    static: Static,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    tokens: BlockTokens,
    output: jax.Array,
    log_sum_exp: jax.Array,
    output_cotangent: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Float32 gradients of query ``[Q, B, h, g, q, d]``, key and value ``[K, B, h, k, d]``."""
    query, key, value, tokens, output_cotangent = _tied((query, key, value, tokens, output_cotangent))
    output_cotangent = output_cotangent.astype(jnp.float32)
    # delta_i = sum_d dO_i * O_i: the softmax backward's row term, [Q, B, h, g, q].
    delta = jnp.sum(output_cotangent * output.astype(jnp.float32), axis=-1)
    if static.pairs is not None:
        query_gradients: list = [None] * query.shape[0]
        key_gradients: list = [None] * key.shape[0]
        value_gradients: list = [None] * key.shape[0]
        for query_index, key_index in static.pairs:
            mask = _mask(static, tokens, query_index, key_index)
            grads = _pair_gradients(
                static,
                query[query_index],
                key[key_index],
                value[key_index],
                output_cotangent[query_index],
                log_sum_exp[query_index],
                delta[query_index],
                mask,
            )
            for store, index, grad in zip(
                (query_gradients, key_gradients, value_gradients),
                (query_index, key_index, key_index),
                grads,
                strict=True,
            ):
                store[index] = grad if store[index] is None else store[index] + grad

        def stacked(grads: list, like: jax.Array) -> jax.Array:
            zeros = jnp.zeros(like.shape[1:], jnp.float32)
            return jnp.stack([zeros if grad is None else grad for grad in grads])

        return stacked(query_gradients, query), stacked(key_gradients, key), stacked(value_gradients, value)

    def one_key_block(query_gradient: jax.Array, xs: tuple) -> tuple[jax.Array, tuple]:
        key_index, key_block, value_block = xs

        def one_query_block(carry: tuple, query_index: jax.Array) -> tuple[tuple, jax.Array]:
            mask = _mask(static, tokens, query_index, key_index)

            def update(carry: tuple) -> tuple[tuple, jax.Array]:
                query_grad, key_grad, value_grad = _pair_gradients(
                    static,
                    query[query_index],
                    key_block,
                    value_block,
                    output_cotangent[query_index],
                    log_sum_exp[query_index],
                    delta[query_index],
                    mask,
                )
                return (carry[0] + key_grad, carry[1] + value_grad), query_grad

            def skip(carry: tuple) -> tuple[tuple, jax.Array]:
                return carry, jnp.zeros(query.shape[1:], jnp.float32)

            return jax.lax.cond(jnp.any(mask), update, skip, carry)

        initial = (jnp.zeros(key_block.shape, jnp.float32), jnp.zeros(value_block.shape, jnp.float32))
        (key_grad, value_grad), query_grads = jax.lax.scan(
            one_query_block, initial, jnp.arange(query.shape[0])
        )
        return query_gradient + query_grads, (key_grad, value_grad)

    query_gradient, (key_gradient, value_gradient) = jax.lax.scan(
        one_key_block,
        jnp.zeros(query.shape, jnp.float32),
        (jnp.arange(key.shape[0]), key, value),
    )
    return query_gradient, key_gradient, value_gradient
