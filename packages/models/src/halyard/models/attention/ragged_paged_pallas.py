"""The TPU's paged attention kernel of an engine step: JAX's Pallas ragged paged attention
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``, the kernel vLLM's TPU backend grew from).

One call attends a whole ragged step (`halyard.models.attention.ragged_paged`: prefill chunks and decode
rows side by side, ``cu_q_lens`` / ``kv_lens`` / ``page_table`` / ``num_seqs``). The kernel walks blocks of
``num_queries_per_block`` tokens; for each sequence in a block it copies ``num_kv_pages_per_block`` of the
sequence's pages at a time from HBM into VMEM by DMA (double-buffered: the next block's pages arrive while
this block is computed), and runs the online softmax over them, all query heads of a kv head together
(grouped-query attention without repeating kv heads). Causal masking, ``sliding_window`` and the logit soft
cap are the kernel's own; keys past ``kv_lens`` are zeroed before use.

**The pool layout is the kernel's**: ``[layers, page, page_slot, kv_combined, head_lanes]``, where a page
holds every kv head's keys and values interleaved (``kv_combined`` entry ``2 * h`` is head ``h``'s key,
``2 * h + 1`` its value: one DMA brings a page's keys and values) and ``head_lanes`` is the head size padded
to a multiple of 128 (the TPU's lanes; the kernel supports no other head size: a head size of 64 is stored
in 128 lanes, twice the memory). A layer's pages are read in place: the pool is viewed as
``[layers * page, ...]`` (a bitcast) and the page table offset by ``layer * page``, so a traced layer index
copies nothing.

A kv head's query heads are padded with zero queries to a group the kernel compiles
(`padded_query_group`: 7, Qwen2.5-0.5B's 14 on 2, becomes 8).

Limits (one-line errors from `pallas_unsupported_reason`): float32 or bfloat16; query heads a multiple of
kv heads; ``2 * kv_heads`` rows that the TPU tiles whole: 1, 2 or 4 kv heads or a multiple of 4 (float32),
1, 2, 4 or 8 or a multiple of 8 (bfloat16).

Off TPU the same kernel runs in Pallas's TPU interpreter (`halyard.models.attention.pallas_interpret`:
exact, slow, for tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from halyard.named import Axis, NamedArray

LANES = 128
"""The kernel's head size is a multiple of the TPU's 128 lanes; smaller heads are zero-padded."""
POOL_AXES = ("layers", "page", "page_slot", "kv_combined", "head_lanes")
"""The pool's axes (see the module docstring)."""
KV_BUFFER_BYTES = 8 * 2**20
"""VMEM for a block's double buffer of pages when the block sizes come from JAX's table (see
`kv_pages_in_vmem`); with ``vmem_limit_bytes`` given, half of it."""
INTERPRET_BLOCKS = (4, 16)
"""``(num_kv_pages_per_block, num_queries_per_block)`` off TPU, where the tuned table has no entry."""


def pallas_unsupported_reason(query_heads: int | None, kv_heads: int, dtype: Any) -> str | None:
    """Why the kernel cannot run these shapes, or None when it can.

    Args:
        query_heads: query heads (None: not known yet, as in `PallasPagedKernel.init_pool`).
        kv_heads: key/value heads.
        dtype: the pool's (and the queries') dtype.
    """
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        return f"the Pallas paged kernel takes float32 or bfloat16 pages, got {dtype}"
    if query_heads is not None and query_heads % kv_heads:
        return (
            f"the Pallas paged kernel needs query heads ({query_heads}) a multiple of kv heads ({kv_heads})"
        )
    packing = 4 // dtype.itemsize  # rows of this dtype in one 32-bit row
    rows = 2 * kv_heads // packing
    if (2 * kv_heads) % packing or not (rows in (1, 2, 4, 8) or rows % 8 == 0):
        whole = "1, 2, 4 or a multiple of 4" if packing == 1 else "1, 2, 4, 8 or a multiple of 8"
        return f"the Pallas paged kernel at {dtype} takes {whole} kv heads (TPU tiling), got {kv_heads}"
    return None


@dataclasses.dataclass(frozen=True)
class PallasPagedKernel:
    """`halyard.models.attention.ragged_paged.RaggedPagedKernel` on JAX's Pallas TPU kernel (module
    docstring). Static: its fields are Python settings.

    Attributes:
        num_kv_pages_per_block: pages one DMA block brings (clipped to a sequence's page-table width);
            None: JAX's tuned table on TPU (`get_tuned_block_sizes`, at most what fits `KV_BUFFER_BYTES`),
            `INTERPRET_BLOCKS` elsewhere.
        num_queries_per_block: tokens per query block; None: as above.
        vmem_limit_bytes: the kernel's VMEM limit; None: the compiler's default.
        interpret: run in Pallas's TPU interpreter; None: everywhere but on a TPU.
    """

    num_kv_pages_per_block: int | None = None
    num_queries_per_block: int | None = None
    vmem_limit_bytes: int | None = None
    interpret: bool | None = None

    def __post_init__(self) -> None:
        for field in ("num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"PallasPagedKernel.{field} must be a positive int or None, got {value!r}")

    def init_pool(
        self, layers: int, pages: int, page_size: int, kv_heads: int, head_size: int, dtype: Any
    ) -> NamedArray:
        """An empty pool, ``[layers, page, page_slot, kv_combined, head_lanes]`` (module docstring).

        Raises:
            ValueError: a dtype or number of kv heads the kernel cannot run (`pallas_unsupported_reason`).
        """
        reason = pallas_unsupported_reason(None, kv_heads, dtype)
        if reason is not None:
            raise ValueError(f"PallasPagedKernel.init_pool: {reason}")
        sizes = (layers, pages, page_size, 2 * kv_heads, _round_up(head_size, LANES))
        axes = tuple(Axis(name, size) for name, size in zip(POOL_AXES, sizes))
        return NamedArray(jnp.zeros(sizes, dtype), axes)

    def write(
        self,
        pool: NamedArray,
        layer: Int[Array, ""],
        keys: Float[Array, "T h d"],
        values: Float[Array, "T h d"],
        slots: Int[Array, " T"],
    ) -> NamedArray:
        """``pool`` with layer ``layer``'s keys and values stored at ``slots`` (``page * page_size + offset``;
        -1: not stored), one scatter of interleaved key/value rows."""
        layers, pages, page_size, combined, lanes = pool.array.shape
        tokens, kv_heads, head_size = keys.shape
        if 2 * kv_heads != combined or head_size > lanes:
            raise ValueError(
                f"PallasPagedKernel.write: keys of {kv_heads} heads of {head_size} for a pool of "
                f"{combined // 2} heads of {lanes} lanes"
            )
        pad = ((0, 0), (0, 0), (0, lanes - head_size))
        rows = jnp.stack([jnp.pad(keys, pad), jnp.pad(values, pad)], axis=2).reshape(tokens, combined, lanes)
        per_layer = pages * page_size
        # a padding slot goes past the pool (dropped); -1 itself would wrap around to the last slot
        flat = jnp.where(slots >= 0, layer * per_layer + slots, layers * per_layer)
        table = pool.array.reshape(layers * per_layer, combined, lanes)
        table = table.at[flat].set(rows.astype(table.dtype), mode="drop")
        return NamedArray(table.reshape(pool.array.shape), pool.axes)

    def attend(
        self,
        query: Float[Array, "T Hq d"],
        pool: NamedArray,
        layer: Int[Array, ""],
        page_table: Int[Array, "S J"],
        cu_q_lens: Int[Array, " S1"],
        kv_lens: Int[Array, " S"],
        num_seqs: Int[Array, ""],
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> Float[Array, "T Hq d"]:
        """Causal attention of the step's tokens over their sequences' pages (the step's keys written):
        `halyard.models.attention.ragged_paged.RaggedPagedKernel.attend`. Padding tokens get zeros.

        Raises:
            ValueError: shapes the kernel cannot run (`pallas_unsupported_reason`), a query whose dtype is
                not the pool's, or a ``sliding_window`` / ``logit_softcap`` that is not positive.
        """
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

        layers, pages, page_size, combined, lanes = pool.array.shape
        tokens, query_heads, head_size = query.shape
        reason = pallas_unsupported_reason(query_heads, combined // 2, pool.dtype)
        if reason is None and query.dtype != pool.dtype:
            reason = f"queries are {query.dtype} and the pool {pool.dtype}: the kernel takes one dtype"
        if reason is None and sliding_window is not None and sliding_window < 1:
            reason = f"sliding_window must be a positive number of keys, got {sliding_window}"
        if reason is None and logit_softcap is not None and not logit_softcap > 0:
            reason = f"logit_softcap must be positive, got {logit_softcap}"
        if reason is not None:
            raise ValueError(f"PallasPagedKernel.attend: {reason}")
        interpret = jax.default_backend() != "tpu" if self.interpret is None else self.interpret
        kv_heads, group = combined // 2, query_heads // (combined // 2)
        padded_group = padded_query_group(group)
        # [T, h, group, d] -> each kv head's group of query heads padded with zero queries, d to the lanes
        grouped = query.reshape(tokens, kv_heads, group, head_size)
        grouped = jnp.pad(grouped, ((0, 0), (0, 0), (0, padded_group - group), (0, lanes - head_size)))
        queries = grouped.reshape(tokens, kv_heads * padded_group, lanes)
        kv_pages_per_block, queries_per_block = self._blocks(queries, pool, page_table.shape[1], interpret)
        padded = _round_up(tokens, queries_per_block)
        queries = jnp.pad(queries, ((0, padded - tokens), (0, 0), (0, 0)))
        # every layer's pages as one table; a page-table entry past a sequence's keys may be any page, so
        # clip it into this layer's pages (the kernel's DMAs read what the table names)
        page_indices = layer * pages + jnp.clip(page_table, 0, pages - 1)
        call = dict(
            sm_scale=float(scale),
            sliding_window=sliding_window,
            soft_cap=None if logit_softcap is None else float(logit_softcap),
            num_kv_pages_per_block=kv_pages_per_block,
            num_queries_per_block=queries_per_block,
            vmem_limit_bytes=self.vmem_limit_bytes,
        )
        arguments = (
            queries,
            pool.array.reshape(layers * pages, page_size, combined, lanes),
            kv_lens.astype(jnp.int32),
            page_indices.astype(jnp.int32),
            cu_q_lens.astype(jnp.int32),
            jnp.reshape(num_seqs, (1,)).astype(jnp.int32),
        )
        if interpret:
            from halyard.models.attention.pallas_interpret import tpu_interpret_mode

            with tpu_interpret_mode():
                output = ragged_paged_attention(*arguments, **call)
        else:
            output = ragged_paged_attention(*arguments, **call)
        # the kernel leaves padding tokens' rows as its buffers held them (NaN in the interpreter)
        real = jnp.arange(tokens) < cu_q_lens[jnp.reshape(num_seqs, ())]
        output = output[:tokens].reshape(tokens, kv_heads, padded_group, lanes)[:, :, :group, :head_size]
        output = output.reshape(tokens, query_heads, head_size)
        return jnp.where(real[:, None, None], output, 0).astype(query.dtype)

    def _blocks(
        self, query: jax.Array, pool: NamedArray, pages_per_seq: int, interpret: bool
    ) -> tuple[int, int]:
        """``(num_kv_pages_per_block, num_queries_per_block)`` for this call (see the attributes)."""
        kv_pages, queries = self.num_kv_pages_per_block, self.num_queries_per_block
        if kv_pages is None or queries is None:
            if interpret:
                tuned = INTERPRET_BLOCKS
            else:
                from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

                _, _, page_size, combined, lanes = pool.array.shape
                # the table's key, as the kernel forms it when it is given no block sizes
                heads, combined_heads = kernel.get_min_heads_per_blk(
                    query.shape[1], combined, query.dtype, pool.dtype
                )
                tuned = kernel.get_tuned_block_sizes(
                    query.dtype, pool.dtype, heads, combined_heads // 2, lanes, page_size,
                    query.shape[0], pages_per_seq,
                )  # fmt: skip
                budget = KV_BUFFER_BYTES if self.vmem_limit_bytes is None else self.vmem_limit_bytes // 2
                fitting = kv_pages_in_vmem(page_size, combined, lanes, pool.dtype, budget)
                tuned = (min(tuned[0], fitting), tuned[1])
            kv_pages = tuned[0] if kv_pages is None else kv_pages
            queries = tuned[1] if queries is None else queries
        return min(kv_pages, pages_per_seq), min(queries, _round_up(query.shape[0], 8))


def kv_pages_in_vmem(page_size: int, combined: int, lanes: int, dtype: Any, budget_bytes: int) -> int:
    """The most pages a block may bring so that its double buffer of pages fits ``budget_bytes``, each page's
    ``combined`` rows counted as the TPU tiles them (8 rows of 32 bits: 4 combined heads of bfloat16 take 16
    rows). JAX's table defaults to 128 pages a block, which at page size 16 and 2 kv heads in bfloat16 is
    16 MiB of buffers: the whole scoped VMEM of a v5e.

    Args:
        page_size, combined, lanes: a page's shape in the pool (`POOL_AXES`).
        dtype: the pool's dtype.
        budget_bytes: VMEM for the two buffers.
    """
    itemsize = jnp.dtype(dtype).itemsize
    page_bytes = page_size * _round_up(combined, 8 * (4 // itemsize)) * lanes * itemsize
    return max(1, budget_bytes // (2 * page_bytes))


def padded_query_group(group: int) -> int:
    """The query heads per kv head the kernel is given for ``group``: a power of two up to 8, else a multiple
    of 8. JAX's kernel folds a kv head's query heads into the rows of one matmul operand, which the TPU tiles
    by 8 rows; JAX tests the groups 1, 2, 4 and 8, and its tests note that 12 query heads on 2 kv heads (6)
    fail to compile. The padding queries are zeros and their outputs are dropped: a decode step reads each
    key once whatever the group, so it costs arithmetic, not memory traffic."""
    if group <= 8:
        return 1 << (group - 1).bit_length()
    return _round_up(group, 8)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
