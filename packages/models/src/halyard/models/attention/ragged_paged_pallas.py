"""The TPU's paged attention kernel of an engine step: JAX's Pallas ragged paged attention
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``, the kernel vLLM's TPU backend grew from).

One call attends a whole ragged step (`halyard.models.attention.ragged_paged`: prefill chunks and decode
rows side by side, ``cu_q_lens`` / ``kv_lens`` / ``page_table`` / ``num_seqs``). The kernel walks blocks of
``num_queries_per_block`` tokens; for each sequence in a block it copies ``num_kv_pages_per_block`` of the
sequence's pages at a time from HBM into VMEM by DMA (double-buffered: the next block's pages arrive while
this block is computed), and runs the online softmax over them, all query heads of a kv head together
(grouped-query attention without repeating kv heads). Causal masking, ``sliding_window`` and the logit soft
cap are the kernel's own; keys past ``kv_lens`` are zeroed before use.

**The pool layout is the kernel's** (`PallasPool`): ``[layers, page, page_slot, kv_combined, head_lanes]``,
a page holding every kv head's keys and values interleaved (``kv_combined`` entry ``2 r`` is row ``r``'s
keys, ``2 r + 1`` its values: one DMA brings a page's keys and values) in rows of a multiple of 128 lanes.
How the model's heads fill those rows (two heads of 64 side by side in one row of 128 lanes, rows and query
groups padded to what the TPU tiles) is `halyard.models.attention.pallas_paged_layout`. A layer's pages are
read in place: the pool is viewed as ``[layers * page, ...]`` (a bitcast) and the page table offset by
``layer * page``, so a traced layer index copies nothing.

The kernel is given only the sequences that have tokens this step, and a stand-in sequence when none has
(`kernel_sequences`): its chain of page copies leaves a copy un-waited otherwise, which halts a TPU (the
engine's warm-up step on pure padding did).

A decode program (at most one token a sequence slot) runs our token-by-token kernel instead
(`halyard.models.attention.paged_decode_pallas`, `PallasPagedKernel.by_token`): several tokens' pages copied
together, each token attending only its own query heads; on the v5e it took 12% less time at 550 keys and the
same at 2048, and gave JAX's kernel's bits where one chunk holds a token's keys (benchmarks/README.md).

Limits (one-line errors from `pallas_unsupported_reason`): float32 or bfloat16 pages, the queries' dtype;
query heads a multiple of kv heads.

Off TPU the same kernel runs in Pallas's TPU interpreter (`halyard.models.attention.pallas_interpret`:
exact, slow, for tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from halyard.models.attention.paged_decode_pallas import TokenStep, decode_attention
from halyard.models.attention.pallas_paged_layout import RowLayout
from halyard.models.attention.ragged_paged import token_sequences
from halyard.named import Axis, NamedArray

POOL_AXES = ("layers", "page", "page_slot", "kv_combined", "head_lanes")
"""The pool's axes (see the module docstring)."""
KV_BUFFER_BYTES = 8 * 2**20
"""VMEM for a block's double buffer of pages when the block sizes come from JAX's table (see
`kv_pages_in_vmem`); with ``vmem_limit_bytes`` given, half of it."""
DECODE_QUERIES_PER_BLOCK = 8
"""Queries per block in a decode program (`decode_blocks`): the fewest the TPU tiles (8 sublanes)."""
DECODE_KV_BUFFER_BYTES = 16 * 2**20
"""VMEM for a decode program's double buffer of pages: its query blocks are small, so the pages may take twice
`KV_BUFFER_BYTES` (the v5e's sweep in benchmarks/README.md compiled 8 pages of 256 tokens a block)."""
BY_TOKEN = ("decode", "always", "never")
"""`PallasPagedKernel.by_token`'s choices."""
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
    return None


class PallasPool(eqx.Module):
    """`PallasPagedKernel`'s pool: every layer's pages and where the model's heads sit in their rows.

    Attributes:
        pages: ``[layers, page, page_slot, kv_combined, head_lanes]`` (`POOL_AXES`).
        layout: the heads' places in the rows (static).
    """

    pages: NamedArray
    layout: RowLayout = eqx.field(static=True)


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
        by_token: which programs run our token-by-token kernel
            (`halyard.models.attention.paged_decode_pallas`) instead of JAX's: ``"decode"`` those of at
            most one token a sequence slot (``T <= S``: the decode steps), ``"always"``, ``"never"``.
        decode_chunk_keys: the token kernel's online-softmax chunk in keys; None: its ``CHUNK_KEYS``.
    """

    num_kv_pages_per_block: int | None = None
    num_queries_per_block: int | None = None
    vmem_limit_bytes: int | None = None
    interpret: bool | None = None
    by_token: str = "decode"
    decode_chunk_keys: int | None = None

    def __post_init__(self) -> None:
        if self.by_token not in BY_TOKEN:
            raise ValueError(f"PallasPagedKernel.by_token must be one of {BY_TOKEN}, got {self.by_token!r}")
        for field in (
            "num_kv_pages_per_block",
            "num_queries_per_block",
            "vmem_limit_bytes",
            "decode_chunk_keys",
        ):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"PallasPagedKernel.{field} must be a positive int or None, got {value!r}")

    def init_pool(
        self, layers: int, pages: int, page_size: int, kv_heads: int, head_size: int, dtype: Any
    ) -> PallasPool:
        """An empty pool (`PallasPool`; module docstring).

        Raises:
            ValueError: a dtype the kernel cannot run (`pallas_unsupported_reason`).
        """
        reason = pallas_unsupported_reason(None, kv_heads, dtype)
        if reason is not None:
            raise ValueError(f"PallasPagedKernel.init_pool: {reason}")
        layout = RowLayout.for_heads(kv_heads, head_size, dtype)
        sizes = (layers, pages, page_size, 2 * layout.rows, layout.lanes)
        axes = tuple(Axis(name, size) for name, size in zip(POOL_AXES, sizes))
        return PallasPool(NamedArray(jnp.zeros(sizes, dtype), axes), layout)

    def write(
        self,
        pool: PallasPool,
        layer: Int[Array, ""],
        keys: Float[Array, "T h d"],
        values: Float[Array, "T h d"],
        slots: Int[Array, " T"],
    ) -> PallasPool:
        """``pool`` with layer ``layer``'s keys and values stored at ``slots`` (``page * page_size + offset``;
        -1: not stored), one scatter of each token's rows."""
        layers, pages, page_size, combined, lanes = pool.pages.array.shape
        layout = pool.layout
        if keys.shape[1:] != (layout.kv_heads, layout.head_size):
            raise ValueError(
                f"PallasPagedKernel.write: keys of {keys.shape[1]} heads of {keys.shape[2]} for a pool of "
                f"{layout.kv_heads} heads of {layout.head_size}"
            )
        rows = layout.kernel_rows(keys, values)
        per_layer = pages * page_size
        # a padding slot goes past the pool (dropped); -1 itself would wrap around to the last slot
        flat = jnp.where(slots >= 0, layer * per_layer + slots, layers * per_layer)
        table = pool.pages.array.reshape(layers * per_layer, combined, lanes)
        table = table.at[flat].set(rows.astype(table.dtype), mode="drop")
        return PallasPool(NamedArray(table.reshape(pool.pages.array.shape), pool.pages.axes), layout)

    def prepare(
        self,
        pool: PallasPool,
        page_table: Int[Array, "S J"],
        cu_q_lens: Int[Array, " S1"],
        kv_lens: Int[Array, " S"],
        num_seqs: Int[Array, ""],
        *,
        tokens: int,
    ) -> TokenStep | SequenceStep:
        """The step as the kernel that runs it reads it (`halyard.models.attention.ragged_paged.RaggedPagedKernel
        .prepare`): for our token kernel each token's sequence and visible keys (`TokenStep`), for JAX's the
        sequences it is given (`SequenceStep`, `kernel_sequences`); page-table entries clipped into one layer's
        pages (an entry past a sequence's keys may be any page, and the kernels' copies read what it names)."""
        pages = pool.pages.array.shape[1]
        table = jnp.clip(page_table, 0, pages - 1).astype(jnp.int32)
        real = jnp.arange(tokens) < cu_q_lens[jnp.reshape(num_seqs, ())]
        if self.by_token == "always" or (self.by_token == "decode" and tokens <= page_table.shape[0]):
            sequence, position = token_sequences(cu_q_lens, kv_lens, num_seqs, tokens)
            return TokenStep(sequence, position + 1, table, real)
        return SequenceStep(*kernel_sequences(cu_q_lens, kv_lens, table, num_seqs), real)

    def attend(
        self,
        query: Float[Array, "T Hq d"],
        pool: PallasPool,
        layer: Int[Array, ""],
        step: TokenStep | SequenceStep,
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> Float[Array, "T Hq d"]:
        """Causal attention of the step's tokens over their sequences' pages (the step's keys written):
        `halyard.models.attention.ragged_paged.RaggedPagedKernel.attend`. Padding tokens get zeros.

        Raises:
            ValueError: shapes the kernel cannot run (`pallas_unsupported_reason`), a query whose dtype or
                head size is not the pool's, or a ``sliding_window`` / ``logit_softcap`` that is not positive.
        """
        _check_call(query, pool, sliding_window, logit_softcap)
        layers, pages, page_size, combined, lanes = pool.pages.array.shape
        layout, tokens = pool.layout, query.shape[0]
        interpret = jax.default_backend() != "tpu" if self.interpret is None else self.interpret
        queries = layout.kernel_queries(query)
        # every layer's pages as one table: this layer's are layer * pages ...
        page_indices = layer * pages + step.table
        all_pages = pool.pages.array.reshape(layers * pages, page_size, combined, lanes)
        if isinstance(step, TokenStep):
            chunk = {} if self.decode_chunk_keys is None else {"chunk_keys": self.decode_chunk_keys}
            group = queries.shape[1] // layout.rows
            output = decode_attention(
                queries, all_pages, page_indices, step.sequence, step.keys, group=group, scale=scale,
                sliding_window=sliding_window, logit_softcap=logit_softcap, interpret=interpret, **chunk,
            )  # fmt: skip
            return _outputs(output, layout, query, step.real)
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

        kv_pages_per_block, queries_per_block = self._blocks(
            queries, pool, (step.table.shape[0], step.table.shape[1]), interpret
        )
        padded = _round_up(tokens, queries_per_block)
        queries = jnp.pad(queries, ((0, padded - tokens), (0, 0), (0, 0)))
        call = dict(
            sm_scale=float(scale),
            sliding_window=sliding_window,
            soft_cap=None if logit_softcap is None else float(logit_softcap),
            num_kv_pages_per_block=kv_pages_per_block,
            num_queries_per_block=queries_per_block,
            vmem_limit_bytes=self.vmem_limit_bytes,
        )
        arguments = (queries, all_pages, step.kv_lens, page_indices, step.cu_q_lens, step.num_seqs)
        if interpret:
            from halyard.models.attention.pallas_interpret import tpu_interpret_mode

            with tpu_interpret_mode():
                output = ragged_paged_attention(*arguments, **call)
        else:
            output = ragged_paged_attention(*arguments, **call)
        return _outputs(output[:tokens], layout, query, step.real)

    def _blocks(
        self, queries: jax.Array, pool: PallasPool, table_shape: tuple[int, int], interpret: bool
    ) -> tuple[int, int]:
        """``(num_kv_pages_per_block, num_queries_per_block)`` for this call (see the attributes): a decode
        program's from `decode_blocks`, others' from JAX's table; ``table_shape`` is the page table's."""
        kv_pages, queries_per_block = self.num_kv_pages_per_block, self.num_queries_per_block
        sequences, pages_per_seq = table_shape
        if kv_pages is None or queries_per_block is None:
            if interpret:
                tuned = INTERPRET_BLOCKS
            else:
                _, _, page_size, combined, lanes = pool.pages.array.shape
                dtype = pool.pages.dtype
                half = None if self.vmem_limit_bytes is None else self.vmem_limit_bytes // 2
                fit = kv_pages_in_vmem(page_size, combined, lanes, dtype, half or DECODE_KV_BUFFER_BYTES)
                decode = decode_blocks(queries.shape[0], sequences, pages_per_seq, fit)
                tuned = decode or self._tuned(queries, pool, pages_per_seq, half or KV_BUFFER_BYTES)
            kv_pages = tuned[0] if kv_pages is None else kv_pages
            queries_per_block = tuned[1] if queries_per_block is None else queries_per_block
        return min(kv_pages, pages_per_seq), min(queries_per_block, _round_up(queries.shape[0], 8))

    @staticmethod
    def _tuned(queries: jax.Array, pool: PallasPool, pages_per_seq: int, budget: int) -> tuple[int, int]:
        """JAX's tuned ``(num_kv_pages_per_block, num_queries_per_block)``, the pages at most what fits
        ``budget`` bytes of VMEM double-buffered."""
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

        _, _, page_size, combined, lanes = pool.pages.array.shape
        dtype = pool.pages.dtype
        # the table's key, as the kernel forms it when it is given no block sizes
        heads, combined_heads = kernel.get_min_heads_per_blk(queries.shape[1], combined, queries.dtype, dtype)
        tuned = kernel.get_tuned_block_sizes(
            queries.dtype,
            dtype,
            heads,
            combined_heads // 2,
            lanes,
            page_size,
            queries.shape[0],
            pages_per_seq,
        )
        return min(tuned[0], kv_pages_in_vmem(page_size, combined, lanes, dtype, budget)), tuned[1]


class SequenceStep(NamedTuple):
    """A step as JAX's kernel is given it (`kernel_sequences`; `PallasPagedKernel.prepare`).

    Attributes:
        kv_lens, table, cu_q_lens, num_seqs: the sequences with tokens first (``table`` clipped into one
            layer's pages).
        real: ``[T]`` which tokens are not padding.
    """

    kv_lens: jax.Array
    table: jax.Array
    cu_q_lens: jax.Array
    num_seqs: jax.Array
    real: jax.Array


def _check_call(
    query: jax.Array, pool: PallasPool, sliding_window: int | None, logit_softcap: float | None
) -> None:
    """`PallasPagedKernel.attend`'s one-line refusals (its docstring's Raises)."""
    layout, pages_dtype = pool.layout, pool.pages.dtype
    _, query_heads, head_size = query.shape
    reason = pallas_unsupported_reason(query_heads, layout.kv_heads, pages_dtype)
    if reason is None and (query.dtype, head_size) != (pages_dtype, layout.head_size):
        reason = (
            f"queries are {query.dtype} of head size {head_size} and the pool {pages_dtype} of "
            f"{layout.head_size}: the kernel takes one dtype and head size"
        )
    if reason is None and sliding_window is not None and sliding_window < 1:
        reason = f"sliding_window must be a positive number of keys, got {sliding_window}"
    if reason is None and logit_softcap is not None and not logit_softcap > 0:
        reason = f"logit_softcap must be positive, got {logit_softcap}"
    if reason is not None:
        raise ValueError(f"PallasPagedKernel.attend: {reason}")


def _outputs(output: jax.Array, layout: RowLayout, query: jax.Array, real: jax.Array) -> jax.Array:
    """A kernel's ``[T, rows * group, lanes]`` outputs as the model's ``[T, Hq, d]``, padding tokens 0 (the
    kernels leave their rows as their buffers held them: NaN in the interpreter)."""
    output = layout.model_outputs(output, query.shape[1])
    return jnp.where(real[:, None, None], output, 0).astype(query.dtype)


def decode_blocks(tokens: int, sequences: int, pages_per_seq: int, fit_pages: int) -> tuple[int, int] | None:
    """``(num_kv_pages_per_block, num_queries_per_block)`` of a decode program, or None for another.

    The kernel computes each sequence of a query block against all of the block's queries (the others
    masked), so a block of 32 queries over 32 decoding rows does 32 times the work it needs. A program of at
    most `DECODE_QUERIES_PER_BLOCK` tokens per sequence on average (``tokens / sequences``, its static shape:
    decode rows, a few tokens of prefill beside them) gets blocks of that many queries, and each sequence's
    pages in as few copies as fit (``fit_pages``, at most ``pages_per_seq``). The block-size sweep on a v5e
    that chose this: benchmarks/README.md, "TPU paged attention".

    Args:
        tokens, sequences, pages_per_seq: the program's token count, sequence rows and page-table width.
        fit_pages: the most pages a block's double buffer holds in VMEM (`kv_pages_in_vmem`).
    """
    if tokens > DECODE_QUERIES_PER_BLOCK * max(sequences, 1):
        return None
    return max(1, min(pages_per_seq, fit_pages)), DECODE_QUERIES_PER_BLOCK


def kernel_sequences(
    cu_q_lens: Int[Array, " S1"],
    kv_lens: Int[Array, " S"],
    page_table: Int[Array, "S J"],
    num_seqs: Int[Array, ""],
) -> tuple[Int[Array, " S"], Int[Array, "S J"], Int[Array, " S1"], Int[Array, " 1"]]:
    """A step's sequences as JAX's kernel is given them, ``(kv_lens, page_indices, cu_q_lens, num_seqs)``, so
    that every page copy (DMA) it starts is waited for exactly once.

    The kernel starts the copy of sequence 0's first block unconditionally at its first grid step, and each
    block's iteration starts the copy of the block it computes next before waiting for its own: a chain,
    balanced when each sequence it visits runs at least one block and the chain's next is what runs next.
    That holds when every sequence it is given has tokens this step (``q_len >= 1``, hence a query block
    visits it) and keys (``kv_len >= 1``, hence at least one block), and there is at least one. Otherwise a
    copy is started and never waited, which halts a TPU ("Semaphore nonzero upon exit from Mosaic kernel"):
    with ``num_seqs == 0`` (the engine's warm-up on pure padding), a sequence of ``kv_len`` 0 (its copy is
    started, its loop runs no block, and the next sequence then reads its pages), or a last sequence of
    ``q_len`` 0 at a query block's end. So here: the sequences with tokens (``s < num_seqs``, ``q_len >= 1``)
    come first, in order (the others have none, so ``cu_q_lens`` of the kept ones is unchanged), each with
    at least one key; and a step with none gets a stand-in sequence of one token over one key (token 0, a
    padding token whose output the caller zeroes). ``page_table`` holds valid page indices.
    """
    slots = kv_lens.shape[0]
    index = jnp.arange(slots, dtype=jnp.int32)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    kept = (index < num_seqs) & (q_lens > 0)
    order = jnp.argsort(jnp.where(kept, index, slots + index))
    count = jnp.sum(kept, dtype=jnp.int32)
    first = index < count
    stand_in = (index == 0) & (count == 0)
    q_lens = jnp.where(first, q_lens[order], 0) + stand_in
    kv_lens = jnp.where(first, jnp.maximum(kv_lens[order], 1), 0) + stand_in
    cu_q_lens = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(q_lens, dtype=jnp.int32)])
    num_seqs = jnp.reshape(jnp.maximum(count, 1), (1,))
    return kv_lens.astype(jnp.int32), page_table[order].astype(jnp.int32), cu_q_lens, num_seqs


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


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
