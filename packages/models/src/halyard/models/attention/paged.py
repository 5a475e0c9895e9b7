"""``blocked``: the ragged paged kernel of any backend (`halyard.models.attention.ragged_paged`), the training
kernel's block arithmetic with each key block read from the pool as the scan reaches it.

The training kernel (`halyard.models.attention.blocked`) walks a query block over key blocks of a contiguous
key array. Here a sequence's keys are its pages, so key block ``j`` is page ``j`` of the sequence's table,
gathered from the pool inside the scan: no run of keys longer than a page is ever copied. A page is one
key block of the training kernel (``page_size`` equals its block), the blocks are visited in the same order
with the same per-block arithmetic (`block_pairs.attend_block`), and blocks the mask hides are skipped, so a
query gets the numbers it gets from the training kernel over the whole sequence.

The flat batch is cut two ways, each a batch of rows over their sequences' pages:

- *blocks*: ``query_block`` new tokens of one sequence at aligned positions (``m * query_block ...``, all
  in this step: the bulk of a prefill chunk) share a row, so each of its pages is gathered once for
  them all;
- *single tokens*: every other token (decoding tokens, the ends of chunks) is a row of one query.

Rows run in groups (``group_rows`` single tokens, ``group_blocks`` blocks, fewer in a program of fewer
tokens); a group whose rows see nothing of a page (padding, or a short sequence) skips it, and single tokens
are grouped longest first, so that a group's rows read about as many pages. Where a token falls does not
change its numbers beyond what XLA's shape-dependent reductions do. Inside `halyard.named.nn.batch_invariant`
none: the row sums are in fixed order and every program's groups have their full number of rows (padding
where a program has fewer), so a token's products are the same compiled products whatever the program's
size (XLA's CPU products of a group of fewer rows summed a row in another order).

Pool layout: keys ``[layers, page, kv_heads, head_size, page_slot]`` (a page's keys of one head are the
operand of the logits' product as it is read), values ``[layers, page, kv_heads, page_slot, head_size]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from halyard.models.attention.block_pairs import Static, attend_block, finish_state, initial_state
from halyard.models.attention.layout import visible
from halyard.models.attention.ragged_paged import slot_pages, token_sequences
from halyard.named import Axis, NamedArray
from halyard.named.nn import invariant_rows

PAGE = "page"
PAGE_SLOT = "page_slot"
KEY_AXES = ("layers", PAGE, "kv_heads", "head_size", PAGE_SLOT)
VALUE_AXES = ("layers", PAGE, "kv_heads", PAGE_SLOT, "head_size")


class BlockedPool(NamedTuple):
    """The ``blocked`` kernel's pool: every layer's keys (`KEY_AXES`) and values (`VALUE_AXES`)."""

    keys: NamedArray
    values: NamedArray


@dataclasses.dataclass(frozen=True)
class BlockedPagedKernel:
    """The ``blocked`` ragged paged kernel (see the module docstring).

    Attributes:
        query_block: new tokens of one sequence per block row.
        group_rows: single-token rows per group.
        group_blocks: block rows per group.
    """

    query_block: int = 16
    group_rows: int = 16
    group_blocks: int = 4

    def init_pool(
        self, layers: int, pages: int, page_size: int, kv_heads: int, head_size: int, dtype: Any
    ) -> BlockedPool:
        """An empty pool (`halyard.models.attention.ragged_paged.RaggedPagedKernel.init_pool`)."""
        sizes = {
            "layers": layers,
            PAGE: pages,
            PAGE_SLOT: page_size,
            "kv_heads": kv_heads,
            "head_size": head_size,
        }

        def zeros(names: tuple[str, ...]) -> NamedArray:
            axes = tuple(Axis(name, sizes[name]) for name in names)
            return NamedArray(jnp.zeros(tuple(a.size for a in axes), dtype), axes)

        return BlockedPool(zeros(KEY_AXES), zeros(VALUE_AXES))

    def write(
        self,
        pool: BlockedPool,
        layer: Int[Array, ""],
        keys: Float[Array, "T h d"],
        values: Float[Array, "T h d"],
        slots: Int[Array, " T"],
    ) -> BlockedPool:
        """``pool`` with the step's keys and values of ``layer`` stored at ``slots`` (-1: nowhere)."""
        key_pool, value_pool = pool.keys.array, pool.values.array
        page, offset = slot_pages(slots, key_pool.shape[-1], key_pool.shape[1])
        # the indexed entries come first ([T, h, d]) when the indices are not adjacent
        key_pool = key_pool.at[layer, page, :, :, offset].set(keys.astype(key_pool.dtype), mode="drop")
        value_pool = value_pool.at[layer, page, :, offset, :].set(
            values.astype(value_pool.dtype), mode="drop"
        )
        return BlockedPool(NamedArray(key_pool, pool.keys.axes), NamedArray(value_pool, pool.values.axes))

    def prepare(
        self,
        pool: BlockedPool,
        page_table: Int[Array, "S J"],
        cu_q_lens: Int[Array, " S1"],
        kv_lens: Int[Array, " S"],
        num_seqs: Int[Array, ""],
        *,
        tokens: int,
    ) -> BlockedStep:
        """The step's rows (`BlockedStep`): `halyard.models.attention.ragged_paged.RaggedPagedKernel.prepare`."""
        block, page_size = self.query_block, pool.keys.array.shape[-1]
        sequence, positions = token_sequences(cu_q_lens, kv_lens, num_seqs, tokens)
        step_start = kv_lens[sequence] - (cu_q_lens[sequence + 1] - cu_q_lens[sequence])
        # a token is in a block row when its whole aligned block of positions is new in this step
        block_first = positions - positions % block
        in_block = (positions >= 0) & (block_first >= step_start) & (block_first + block <= kv_lens[sequence])
        # single tokens, compacted to the front: [T] token indices (tokens for none)
        singles = _compacted((positions >= 0) & ~in_block, tokens)
        # longest first: a group reads the pages its longest row reads, so rows of like lengths share groups
        reads = jnp.where(singles < tokens, positions[jnp.minimum(singles, tokens - 1)] // page_size + 1, 0)
        singles = singles[jnp.argsort(-reads, stable=True)]
        # blocks: the first token of each, compacted; a block's tokens follow it in the flat batch
        firsts = _compacted(in_block & (positions % block == 0), tokens)[: tokens // block]
        members = jnp.where(firsts[:, None] < tokens, firsts[:, None] + jnp.arange(block), tokens)
        return BlockedStep(positions, page_table[sequence], singles[:, None], members)

    def attend(
        self,
        query: Float[Array, "T Hq d"],
        pool: BlockedPool,
        layer: Int[Array, ""],
        step: BlockedStep,
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> Float[Array, "T Hq d"]:
        """`halyard.models.attention.ragged_paged.RaggedPagedKernel.attend` (see the module docstring)."""
        rows = _Rows(query, step.positions, step.tables, pool, layer)
        static = Static(
            causal=True,
            sliding_window=sliding_window,
            scale=float(scale),
            pairs=None,
            logit_softcap=logit_softcap,
        )
        output = jnp.zeros(query.shape, jnp.float32)
        output = rows.attend(static, step.singles, self.group_rows, output)
        output = rows.attend(static, step.blocks, self.group_blocks, output)
        return output.astype(query.dtype)


class BlockedStep(NamedTuple):
    """A step's rows as the ``blocked`` kernel reads them (`BlockedPagedKernel.prepare`).

    Attributes:
        positions: ``[T]`` each token's position (-1: padding).
        tables: ``[T, J]`` each token's sequence's pages.
        singles: ``[T, 1]`` the single-token rows' tokens, compacted to the front, those reading the most
            pages first (``T``: none).
        blocks: ``[T // query_block, query_block]`` the block rows' tokens (``T``: none).
    """

    positions: jax.Array
    tables: jax.Array
    singles: jax.Array
    blocks: jax.Array


def _compacted(chosen: jax.Array, fill: int) -> jax.Array:
    """The indices where ``chosen`` holds, in order, then ``fill`` (same length as ``chosen``)."""
    rank = jnp.cumsum(chosen) - 1
    target = jnp.where(chosen, rank, chosen.shape[0])
    return (
        jnp.full(chosen.shape, fill, jnp.int32)
        .at[target]
        .set(jnp.arange(chosen.shape[0], dtype=jnp.int32), mode="drop")
    )


class _Rows(NamedTuple):
    """What every row group reads: the flat queries and positions, each token's pages, the pool."""

    query: jax.Array  # [T, Hq, d]
    positions: jax.Array  # [T]
    tables: jax.Array  # [T, J]
    pool: BlockedPool
    layer: jax.Array

    def attend(self, static: Static, members: jax.Array, group: int, output: jax.Array) -> jax.Array:
        """``output`` with the rows ``members [R, q]`` (flat token indices, ``T`` for none; a row's tokens
        are of one sequence) attended, ``group`` rows at a time."""
        num_tokens, heads, size = self.query.shape
        key_pool, value_pool = self.pool.keys.array, self.pool.values.array
        kv_heads, page_size = value_pool.shape[2], value_pool.shape[3]
        count, length = members.shape
        if count == 0:
            return output  # a program of fewer tokens than a block has no block rows
        if (
            invariant_rows() is None
        ):  # a program of fewer rows than a group gathers no pages for rows it lacks
            group = min(group, count)  # (inside `batch_invariant` the same rows in every program's groups)
        padded = -(-count // group) * group
        members = jnp.pad(members, ((0, padded - count), (0, 0)), constant_values=num_tokens)
        members = members.reshape(padded // group, group, length)
        safe = jnp.minimum(members, num_tokens - 1)
        positions = jnp.where(members < num_tokens, self.positions[safe], -1)  # [G, group, q]
        queries = self.query[safe].reshape(*safe.shape, kv_heads, heads // kv_heads, size)
        queries = queries.transpose(0, 1, 3, 4, 2, 5)  # [G, group, h, g, q, d]
        tables = self.tables[safe[:, :, 0]]  # [G, group, J]

        def one_group(xs: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            group_queries, group_positions, group_tables = xs

            def one_page(state: tuple, page: jax.Array) -> tuple[tuple, None]:
                key_positions = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
                mask = visible(
                    group_positions, jnp.broadcast_to(key_positions, (group, page_size)), None, None, None,
                    causal=True, sliding_window=static.sliding_window,
                )[:, None, None]  # fmt: skip

                def update(state: tuple) -> tuple:
                    pages = group_tables[:, page]
                    keys, values = key_pool[self.layer, pages], value_pool[self.layer, pages]
                    return attend_block(static, state, group_queries, keys, values, mask, keys_by_size=True)

                return jax.lax.cond(jnp.any(mask), update, lambda state: state, state), None

            pages = jnp.arange(group_tables.shape[1])
            state, _ = jax.lax.scan(one_page, initial_state(group_queries), pages)
            return finish_state(state)[0]  # [group, h, g, q, d]

        results = jax.lax.map(one_group, (queries, positions, tables))
        results = results.transpose(0, 1, 4, 2, 3, 5).reshape(padded * length, heads, size)
        return output.at[members.reshape(-1)].set(results, mode="drop")
