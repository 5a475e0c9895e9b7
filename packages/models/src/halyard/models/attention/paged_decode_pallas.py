"""A decode step's paged attention on TPU, token by token: each query token over its own sequence's pages,
several tokens a grid step (Pallas, our own kernel beside JAX's ragged one).

JAX's ragged kernel (`halyard.models.attention.ragged_paged_pallas`) walks sequences one at a time: for a
decoding row that is one token over a few pages, and the chip then spends its time on each sequence's loop,
copies and masked block of queries rather than on reading keys (benchmarks/README.md, "decode kernel").
Here a grid step takes `TOKENS_PER_BLOCK` tokens and copies every page each of them reads in one batch of
DMAs (double-buffered: the next step's pages arrive while this step computes), then attends each token's
own query heads over its own keys. A token's arithmetic depends only on its own keys and the chunks of the
online softmax (`CHUNK_KEYS`, or the whole page table when it is shorter), in JAX's kernel's formulas. A program of a step in which sequences have several tokens is correct too (each
token reads its sequence's pages), but reads a page once per token: `PallasPagedKernel` gives this kernel
the decode programs only.

Inputs as `PallasPagedKernel` lays them out (`halyard.models.attention.pallas_paged_layout`): queries
``[T, rows * group, lanes]``, pages ``[pages, page_slot, 2 * rows, lanes]`` (keys and values interleaved
by row), each token's sequence slot and visible keys, the page table already pointing at this layer's
pages. Pages before a sliding window or past a token's keys are not copied.

Off TPU it runs in Pallas's TPU interpreter (`halyard.models.attention.pallas_interpret`), for tests.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int

TOKENS_PER_BLOCK = 8
"""Tokens a grid step attends (their pages copied together)."""
CHUNK_KEYS = 1024
"""Keys of one online-softmax chunk by default (whole pages, at least one, at most the page table's)."""
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
"""A masked logit (JAX's kernel's value: finite, so a row of masked logits stays finite)."""
SCOPED_VMEM_BYTES = 16 * 2**20
"""The compiler's default VMEM limit for a kernel; more is asked for only when the buffers need it."""


class TokenStep(NamedTuple):
    """A step as `decode_attention` reads it (`halyard.models.attention.ragged_paged_pallas.PallasPagedKernel.prepare`).

    Attributes:
        sequence: ``[T]`` each token's sequence slot.
        keys: ``[T]`` each token's visible keys (its position + 1; 0 for padding).
        table: ``[S, J]`` the page table, clipped into one layer's pages.
        real: ``[T]`` which tokens are not padding.
    """

    sequence: jax.Array
    keys: jax.Array
    table: jax.Array
    real: jax.Array


def chunk_pages(chunk_keys: int, page_size: int, table_width: int) -> int:
    """Pages of one chunk: ``chunk_keys`` worth, at least one, at most ``table_width``."""
    return max(1, min(chunk_keys // page_size, table_width))


def decode_attention(
    queries: Float[Array, "T G lanes"],
    pages: Float[Array, "P page_slot C lanes"],
    page_indices: Int[Array, "S J"],
    token_sequence: Int[Array, " T"],
    token_keys: Int[Array, " T"],
    *,
    group: int,
    scale: float,
    sliding_window: int | None,
    logit_softcap: float | None,
    interpret: bool,
    chunk_keys: int = CHUNK_KEYS,
) -> Float[Array, "T G lanes"]:
    """Each token's attention over its own sequence's keys (module docstring).

    Args:
        queries: the kernel's queries (`RowLayout.kernel_queries`): row ``r``'s ``group`` query heads at
            ``r * group ...``.
        pages: every layer's pages (the pool viewed as one table of pages).
        page_indices: each sequence slot's pages in position order, valid page indices into ``pages``.
        token_sequence: each token's sequence slot.
        token_keys: each token's visible keys (its position + 1; 0: a padding token, output left undefined).
        group: query heads per row (padded: `padded_query_group`).
        scale, sliding_window, logit_softcap: the attention's settings.
        interpret: run in the TPU interpreter.
        chunk_keys: keys of one online-softmax chunk (`chunk_pages`).

    Returns:
        ``[T, G, lanes]`` in the queries' dtype.
    """
    tokens = queries.shape[0]
    page_size = pages.shape[1]
    sequences, table_width = page_indices.shape
    block = TOKENS_PER_BLOCK
    padded = -(-tokens // block) * block
    queries = jnp.pad(queries, ((0, padded - tokens), (0, 0), (0, 0)))
    token_sequence = jnp.pad(token_sequence.astype(jnp.int32), (0, padded - tokens))
    token_keys = jnp.pad(token_keys.astype(jnp.int32), (0, padded - tokens))
    per_chunk = chunk_pages(chunk_keys, page_size, table_width)
    kernel = functools.partial(
        _kernel,
        table_width=table_width,
        group=group,
        scale=float(scale),
        sliding_window=sliding_window,
        logit_softcap=None if logit_softcap is None else float(logit_softcap),
    )
    call = functools.partial(
        _call, kernel, queries, pages, chunks=-(-table_width // per_chunk), per_chunk=per_chunk
    )
    flat_table = page_indices.astype(jnp.int32).reshape(sequences * table_width)
    if interpret:
        from halyard.models.attention.pallas_interpret import tpu_interpret_mode

        with tpu_interpret_mode():
            output = call(token_sequence, token_keys, flat_table)
    else:
        output = call(token_sequence, token_keys, flat_table)
    return output[:tokens]


def _call(
    kernel: Any, queries: jax.Array, pages: jax.Array, *scalars: jax.Array, chunks: int, per_chunk: int
) -> jax.Array:
    """The ``pallas_call`` of `_kernel` over ``queries`` (padded to whole blocks) and ``pages``, with the
    token and page-table ``scalars`` in SMEM."""
    padded, heads, lanes = queries.shape
    _, page_size, combined, _ = pages.shape
    block = TOKENS_PER_BLOCK
    buffer = (2, block, per_chunk, page_size, combined, lanes)
    buffer_bytes = 2 * block * per_chunk * page_size * combined * lanes * pages.dtype.itemsize
    query_block = pl.BlockSpec((block, heads, lanes), lambda t, c, *_: (t, 0, 0))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(scalars),
            in_specs=[query_block, pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=query_block,
            grid=(padded // block, chunks),
            scratch_shapes=[
                pltpu.VMEM(buffer, pages.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((block, heads, 128), jnp.float32),  # the running maximum
                pltpu.VMEM((block, heads, 128), jnp.float32),  # the running sum
                pltpu.VMEM((block, heads, lanes), jnp.float32),  # the running output
            ],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary", "arbitrary"),
            vmem_limit_bytes=None if buffer_bytes < SCOPED_VMEM_BYTES // 2 else 2 * buffer_bytes + 2**23,
        ),
        out_shape=jax.ShapeDtypeStruct((padded, heads, lanes), queries.dtype),
        name="paged_decode_attention",
    )(*scalars, queries, pages)


def _kernel(
    sequence_ref: Any,
    keys_ref: Any,
    table_ref: Any,
    query_ref: Any,
    pages_ref: Any,
    output_ref: Any,
    buffer: Any,
    semaphores: Any,
    max_ref: Any,
    sum_ref: Any,
    out_ref: Any,
    *,
    table_width: int,
    group: int,
    scale: float,
    sliding_window: int | None,
    logit_softcap: float | None,
) -> None:
    """One grid step ``(token block, chunk)``: start the next step's copies, wait for this one's, attend."""
    block_index, chunk = pl.program_id(0), pl.program_id(1)
    blocks, chunks = pl.num_programs(0), pl.num_programs(1)
    _, block, per_chunk, page_size, _, _ = buffer.shape
    step = block_index * chunks + chunk
    slot = step % 2

    def start(block_index: Any, chunk: Any, slot: Any) -> None:
        for wanted, copy in copies(block_index, chunk, slot):
            pl.when(wanted)(copy.start)

    copies = functools.partial(
        _page_copies,
        (sequence_ref, keys_ref, table_ref, pages_ref, buffer, semaphores),
        table_width=table_width,
        sliding_window=sliding_window,
    )

    @pl.when(step == 0)
    def _first() -> None:
        buffer[...] = jnp.zeros(buffer.shape, buffer.dtype)  # stale bits are then finite (`_attend_chunk`)
        start(block_index, chunk, slot)

    last_chunk = chunk + 1 == chunks
    next_block = jnp.where(last_chunk, block_index + 1, block_index)

    @pl.when(next_block < blocks)
    def _next() -> None:
        start(next_block, jnp.where(last_chunk, 0, chunk + 1), 1 - slot)

    for wanted, copy in copies(block_index, chunk, slot):
        pl.when(wanted)(copy.wait)
    chunk_keys = per_chunk * page_size
    for row in range(block):
        token = block_index * block + row
        keys, first = keys_ref[token], _first_key(keys_ref, token, sliding_window)
        begin = chunk * chunk_keys
        live = (begin < keys) & (begin + chunk_keys > first)
        attend = functools.partial(
            _attend_chunk,
            kv=buffer.at[slot, row],
            query=query_ref.at[row],
            max_ref=max_ref.at[row],
            sum_ref=sum_ref.at[row],
            out_ref=out_ref.at[row],
            keys=keys,
            first=first,
            begin=begin,
            opens=begin <= first,
            group=group,
            scale=scale,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
        )
        pl.when(live)(attend)

    @pl.when(last_chunk)
    def _store() -> None:
        output_ref[...] = out_ref[...].astype(output_ref.dtype)


def _first_key(keys_ref: Any, token: Any, sliding_window: int | None) -> Any:
    """The first key ``token`` sees (0, or its sliding window's start)."""
    return 0 if sliding_window is None else jnp.maximum(keys_ref[token] - sliding_window, 0)


def _page_copies(
    refs: tuple[Any, ...],
    block_index: Any,
    chunk: Any,
    slot: Any,
    *,
    table_width: int,
    sliding_window: int | None,
) -> list[tuple[Any, Any]]:
    """``(wanted, copy)`` of every page a block's tokens read in a chunk: into ``slot`` of the buffer, wanted
    where the page holds keys the token sees. ``refs``: the kernel's sequence, keys, table, pages, buffer and
    semaphore refs."""
    sequence_ref, keys_ref, table_ref, pages_ref, buffer, semaphores = refs
    _, block, per_chunk, page_size, _, _ = buffer.shape
    listed = []
    for row in range(block):
        token = block_index * block + row
        keys, first = keys_ref[token], _first_key(keys_ref, token, sliding_window)
        for place in range(per_chunk):
            page = chunk * per_chunk + place
            wanted = (page < table_width) & (page * page_size < keys) & ((page + 1) * page_size > first)
            index = table_ref[sequence_ref[token] * table_width + jnp.minimum(page, table_width - 1)]
            copy = pltpu.make_async_copy(
                pages_ref.at[index], buffer.at[slot, row, place], semaphores.at[slot]
            )
            listed.append((wanted, copy))
    return listed


def _attend_chunk(
    *,
    kv: Any,
    query: Any,
    max_ref: Any,
    sum_ref: Any,
    out_ref: Any,
    keys: Any,
    first: Any,
    begin: Any,
    opens: Any,
    group: int,
    scale: float,
    sliding_window: int | None,
    logit_softcap: float | None,
) -> None:
    """One token's online-softmax update over one chunk of its keys (JAX's ragged kernel's formulas, so a
    token's bits match it where the chunks do). ``opens``: this is the token's first chunk."""
    per_chunk, page_size, combined, lanes = kv.shape
    chunk_keys = per_chunk * page_size
    rows = combined // 2
    keys_of, values_of = _rows_of(kv.reshape(chunk_keys * combined, lanes), rows)
    heads = query.shape[0]
    question = query[...]
    if group % (4 // jnp.dtype(question.dtype).itemsize):
        question = question.astype(jnp.float32)
    # keys and values past the token's, or in pages not copied, hold stale bits (finite: earlier pages, or the
    # zeros the buffer starts with): their logits are replaced by the mask and their weights are then 0
    logits: Any = None
    row_of_head = lax.broadcasted_iota(jnp.int32, (heads, chunk_keys), 0) // group
    for row in range(rows):
        row_logits = jnp.einsum("nd,md->nm", question, keys_of[row], preferred_element_type=jnp.float32)
        logits = row_logits if logits is None else jnp.where(row_of_head == row, row_logits, logits)
    logits = logits * scale
    if logit_softcap is not None:
        logits = logit_softcap * jnp.tanh(logits / logit_softcap)
    column = begin + lax.broadcasted_iota(jnp.int32, (heads, chunk_keys), 1)
    masked = column >= keys
    if sliding_window is not None:
        masked = masked | (column < first)
    logits = jnp.where(masked, MASK_VALUE, logits)
    chunk_max = jnp.max(logits, axis=1, keepdims=True)
    weights = jnp.exp(logits - chunk_max)
    weighted: Any = None
    row_of_output = lax.broadcasted_iota(jnp.int32, (heads, lanes), 0) // group
    for row in range(rows):
        row_out = jnp.dot(weights, values_of[row], preferred_element_type=jnp.float32)
        weighted = row_out if weighted is None else jnp.where(row_of_output == row, row_out, weighted)
    chunk_max = jnp.broadcast_to(chunk_max, max_ref.shape)
    chunk_sum = jnp.broadcast_to(weights.sum(axis=1, keepdims=True), sum_ref.shape)
    previous_max = jnp.where(opens, jnp.full(max_ref.shape, -jnp.inf, jnp.float32), max_ref[...])
    previous_sum = jnp.where(opens, jnp.zeros(sum_ref.shape, jnp.float32), sum_ref[...])
    previous_out = jnp.where(opens, jnp.zeros(out_ref.shape, jnp.float32), out_ref[...])
    new_max = jnp.maximum(previous_max, chunk_max)
    alpha = jnp.exp(previous_max - new_max)
    beta = jnp.exp(chunk_max - new_max)
    kept = alpha * previous_sum
    new_sum = kept + beta * chunk_sum
    safe_sum = jnp.where(new_sum == 0.0, 1.0, new_sum)
    max_ref[...] = new_max
    sum_ref[...] = safe_sum
    out_ref[...] = lax.div(
        _lanes(kept, lanes) * previous_out + _lanes(beta, lanes) * weighted, _lanes(safe_sum, lanes)
    )


def _lanes(values: Any, lanes: int) -> Any:
    """``[heads, 128]`` of one value per head widened to ``[heads, lanes]`` (``lanes`` a multiple of 128)."""
    return (
        values if lanes == values.shape[1] else jnp.concatenate([values] * (lanes // values.shape[1]), axis=1)
    )


def _rows_of(flat: Any, rows: int) -> tuple[list[Any], list[Any]]:
    """Each row's keys and values ``[chunk_keys, lanes]`` from a chunk's buffer viewed as ``[chunk_keys *
    2 rows, lanes]`` (row ``r``'s keys at ``2 r``, values at ``2 r + 1`` of every slot). A 16-bit pair is one
    32-bit word in the TPU's tiles, so 16-bit pages are read as 32-bit words and split."""
    combined = 2 * rows
    if jnp.dtype(flat.dtype).itemsize == 4:
        return [flat[2 * row :: combined, :] for row in range(rows)], [
            flat[2 * row + 1 :: combined, :] for row in range(rows)
        ]
    if flat.dtype != jnp.bfloat16:
        raise ValueError(f"paged_decode_pallas: float32 or bfloat16 pages, got {flat.dtype}")
    words = flat.bitcast(jnp.uint32)
    keys, values = [], []
    for row in range(rows):
        word = words[row::rows, :]
        keys.append(pltpu.bitcast(word << 16, jnp.float32).astype(jnp.bfloat16))
        values.append(pltpu.bitcast(word & jnp.uint32(0xFFFF0000), jnp.float32).astype(jnp.bfloat16))
    return keys, values
