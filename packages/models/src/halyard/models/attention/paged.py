"""Attention over an inference engine's pages, read where they lie: the blocked kernel's arithmetic with each
key block fetched from the pool as the scan reaches it.

The training kernel (`halyard.models.attention.blocked`) walks a query block over key blocks of a contiguous
key array. Here a row's keys are its pages (``page_table[row]``: page ``j`` holds positions ``j * page_size
...``), so key block ``j`` is page ``j`` of every row, gathered from the pool inside the scan, with this
call's new keys laid over the positions they take (they are stored in the pool after the call). No run of
keys longer than a page is ever copied: a decoding step reads each page once. A page is one key block of
the training kernel (``page_size`` equals its block), the blocks are visited in the same order with the
same per-block arithmetic (`block_pairs._attend`), and blocks the mask hides are skipped, so a query gets
the numbers it gets from the training kernel over the whole sequence.

Shapes: ``B`` rows, ``Q`` query blocks of ``q`` queries, ``h`` kv heads, ``g`` query heads per kv head,
``d`` head size, ``J`` pages a row reads, ``S`` page size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from halyard.models.attention.block_pairs import Static, _attend, _finish, _initial
from halyard.models.attention.layout import visible


def paged_attention(
    query: Float[Array, "B pos heads d"],
    query_positions: Int[Array, "B pos"],
    key_pool: Float[Array, "layers pages h d S"],
    value_pool: Float[Array, "layers pages h S d"],
    layer: Int[Array, ""],
    page_table: Int[Array, "B J"],
    new_keys: Float[Array, "B pos h d"],
    new_values: Float[Array, "B pos h d"],
    write_positions: Int[Array, "B pos"],
    *,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    block_size: int = 64,
) -> Float[Array, "B pos heads d"]:
    """Causal attention of each row's queries over its pages and its new keys (see the module docstring).

    Args:
        query: the call's queries.
        query_positions: each query's position; -1 for padding (it sees nothing: output 0).
        key_pool, value_pool: the pool of pages of every layer (read in place: one gather a page); a page's
            keys are ``d x S`` per head, as the logits' product takes them, its values ``S x d``.
        layer: this layer's index in the pools.
        page_table: each row's pages in position order.
        new_keys, new_values: the call's keys and values, one per query.
        write_positions: the position each new key and value is stored at (-1: not stored), as
            `halyard.models.layers.paged_kv.PagedKV.written` stores them: the kernel lays them over those slots.
        scale: the logit multiplier.
        sliding_window: a query at ``p`` sees keys ``> p - window`` (None: all before it).
        logit_softcap: ``cap * tanh(logits / cap)`` before the mask, or None.
        block_size: queries per query block (the training kernel's block).

    Returns:
        ``[B, pos, heads, d]`` in the query's dtype.
    """
    rows, length, heads, size = query.shape
    pages_per_row, page_size = page_table.shape[1], value_pool.shape[3]
    kv_heads = value_pool.shape[2]
    group = heads // kv_heads
    static = Static(
        causal=True,
        sliding_window=sliding_window,
        scale=float(scale),
        pairs=None,
        logit_softcap=logit_softcap,
    )
    block = min(block_size, length)
    padded = -(-length // block) * block
    pad = [(0, 0), (0, padded - length)]
    queries = jnp.pad(query, pad + [(0, 0), (0, 0)]).reshape(
        rows, padded // block, block, kv_heads, group, size
    )
    queries = queries.transpose(1, 0, 3, 4, 2, 5)  # [Q, B, h, g, q, d]
    positions = jnp.pad(query_positions, pad, constant_values=-1).reshape(rows, padded // block, block)
    positions = positions.transpose(1, 0, 2)  # [Q, B, q]
    row_index = jnp.arange(rows)[:, None]
    new_k, new_v = new_keys.astype(key_pool.dtype), new_values.astype(value_pool.dtype)

    def one_query_block(query_block: jax.Array, query_positions_block: jax.Array) -> jax.Array:
        def one_page(state: tuple, page: jax.Array) -> tuple[tuple, None]:
            key_positions = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
            mask = visible(
                query_positions_block, jnp.broadcast_to(key_positions, (rows, page_size)), None, None, None,
                causal=True, sliding_window=sliding_window,
            )[:, None, None]  # fmt: skip

            def update(state: tuple) -> tuple:
                slots = write_positions - page * page_size  # where the call's tokens land in this page
                slots = jnp.where(
                    (slots >= 0) & (slots < page_size) & (write_positions >= 0), slots, page_size
                )
                # [B, h, d, S] and [B, h, S, d]; the new tokens' entries indexed first: [B, pos, h, d]
                keys = key_pool[layer, page_table[:, page]].at[row_index, :, :, slots].set(new_k, mode="drop")
                values = (
                    value_pool[layer, page_table[:, page]].at[row_index, :, slots].set(new_v, mode="drop")
                )
                return _attend(static, state, query_block, keys, values, mask, keys_by_size=True)

            return jax.lax.cond(jnp.any(mask), update, lambda state: state, state), None

        state, _ = jax.lax.scan(one_page, _initial(query_block), jnp.arange(pages_per_row))
        return _finish(state)[0]

    outputs = jax.lax.map(lambda xs: one_query_block(*xs), (queries, positions))  # [Q, B, h, g, q, d]
    flat = outputs.transpose(1, 0, 4, 2, 3, 5).reshape(rows, padded, heads, size)
    return flat[:, :length].astype(query.dtype)
