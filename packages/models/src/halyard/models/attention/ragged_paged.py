"""Ragged paged attention: the interface every paged kernel of an inference engine step implements.

One engine step is one flat batch of ``T`` query tokens: decoding sequences (one token each) and prefill
chunks (many) side by side, described as vLLM's and tpu-inference's ragged kernels describe it:

- ``cu_q_lens [S + 1]``: sequence ``s``'s tokens are ``cu_q_lens[s] : cu_q_lens[s + 1]`` of the flat batch
  (non-decreasing, ``cu_q_lens[0] == 0``);
- ``kv_lens [S]``: the keys sequence ``s`` has after this step, its new ones included: token ``i`` of
  sequence ``s`` sits at position ``kv_lens[s] - q_len[s] + i`` (``q_len[s] = cu_q_lens[s + 1] -
  cu_q_lens[s]``) and sees the keys at positions ``<=`` its own (within ``sliding_window``);
- ``page_table [S, J]``: sequence ``s``'s pages in position order (page ``j`` holds positions ``j *
  page_size ...``); entries past ``kv_lens[s]`` may be any page;
- ``num_seqs []``: how many of the ``S`` sequence slots are real.

One padding convention, everywhere: the tokens of a step come first, padding after them (flat indices
``>= cu_q_lens[num_seqs]``); a padding token's slot is ``-1`` (it is stored nowhere) and its output is
whatever the kernel gives (callers ignore it); a padding sequence slot (``s >= num_seqs``) has ``q_len 0``
(its ``cu_q_lens`` entries repeat the last real one) and ``kv_len 0``.

Once per step, outside the layer scan, the kernel turns the layout into what it reads
(`RaggedPagedKernel.prepare`). Within a layer the engine first stores the step's new keys and values
(`RaggedPagedKernel.write`, into the donated pool: in place), then attends (`RaggedPagedKernel.attend`), so the
kernel reads every key from the pool, the new ones too. The kernels: ``blocked`` (`halyard.models.attention.paged.BlockedPagedKernel`, any
backend: the training kernel's block arithmetic, page by page) and ``pallas`` (TPU: the class
``PallasPagedKernel`` of ``halyard.models.attention.ragged_paged_pallas``, constructible without
arguments); `halyard.models.attention.dispatch.paged_kernel` picks one.

Shapes: ``T`` tokens, ``S`` sequence slots, ``J`` pages a sequence can read, ``Hq`` query heads, ``h`` kv
heads, ``d`` head size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

PADDING_SLOT = -1
"""The slot of a token that is stored nowhere (padding)."""


class RaggedPagedKernel(Protocol):
    """A paged attention kernel over a flat token batch (see the module docstring).

    Kernels are static (hashable, compared by value): the engine keeps one in its pool's pytree as static
    data, so a kernel object must hold only Python settings.
    """

    def init_pool(
        self, layers: int, pages: int, page_size: int, kv_heads: int, head_size: int, dtype: Any
    ) -> Any:
        """An empty pool of every layer's pages, in this kernel's own layout.

        Args:
            layers, pages, page_size, kv_heads, head_size: the sizes.
            dtype: the dtype keys and values are stored in (the model's compute dtype).

        Returns:
            A pytree whose leaves are `halyard.named.NamedArray` s (named axes, so an engine's layout can
            place them: ``layers``, ``page``, ``page_slot``, ``kv_heads``, ``head_size``, or axes of the
            kernel's own names for combined layouts), each with the leading axis ``layers``.
        """
        ...

    def write(
        self,
        pool: Any,
        layer: Int[Array, ""],
        keys: Float[Array, "T h d"],
        values: Float[Array, "T h d"],
        slots: Int[Array, " T"],
    ) -> Any:
        """``pool`` with layer ``layer``'s new keys and values stored (the engine donates the pool: in place).

        Args:
            pool: as `init_pool` made it.
            layer: the layer's index (traced: the layer scan's).
            keys, values: one per token of the step.
            slots: where each token is stored, ``page * page_size + offset``; `PADDING_SLOT` for none.
        """
        ...

    def prepare(
        self,
        pool: Any,
        page_table: Int[Array, "S J"],
        cu_q_lens: Int[Array, " S1"],
        kv_lens: Int[Array, " S"],
        num_seqs: Int[Array, ""],
        *,
        tokens: int,
    ) -> Any:
        """What `attend` reads of the step's layout, in this kernel's form: computed once per step, outside the
        layer scan (every layer attends the same step), so no layer repeats it.

        Args:
            pool: the pool (for its sizes).
            page_table, cu_q_lens, kv_lens, num_seqs: the batch's layout (module docstring).
            tokens: the step's ``T``.

        Returns:
            A pytree of arrays.
        """
        ...

    def attend(
        self,
        query: Float[Array, "T Hq d"],
        pool: Any,
        layer: Int[Array, ""],
        step: Any,
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> Float[Array, "T Hq d"]:
        """Causal attention of every token of the step over its sequence's keys in ``pool`` (see the module
        docstring; the step's keys are already written). Query head ``q`` reads kv head ``q // (Hq // h)``.

        Args:
            query: the step's queries (already rotated).
            pool: as `write` left it.
            layer: the layer's index (traced).
            step: the step's layout as `prepare` gave it.
            scale: the logit multiplier.
            sliding_window: a query at ``p`` sees keys ``> p - window``; None: all before it.
            logit_softcap: ``cap * tanh(logits / cap)`` before the mask, or None.

        Returns:
            ``[T, Hq, d]`` in the query's dtype (padding tokens: anything finite).
        """
        ...


class RaggedBatch(NamedTuple):
    """One step's flat batch as the model takes it (numpy on the host, jax arrays inside a program).

    Attributes:
        positions: int32 ``[T]``: each token's position (``-1`` for padding).
        slots: int32 ``[T]``: where each token's key and value are stored (`PADDING_SLOT` for padding).
        page_table: int32 ``[S, J]``.
        cu_q_lens: int32 ``[S + 1]``.
        kv_lens: int32 ``[S]``.
        num_seqs: int32 ``[]``.
    """

    positions: Any
    slots: Any
    page_table: Any
    cu_q_lens: Any
    kv_lens: Any
    num_seqs: Any


def ragged_batch(
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    page_tables: Sequence[Sequence[int]],
    *,
    page_size: int,
    tokens: int,
    seqs: int,
    pages: int,
) -> RaggedBatch:
    """The host-side layout of a step (numpy), padded to ``tokens`` tokens, ``seqs`` sequence slots and
    ``pages`` pages per sequence.

    Args:
        q_lens: each sequence's new tokens this step (at least 1).
        kv_lens: each sequence's keys after this step (at least its ``q_len``).
        page_tables: each sequence's pages in order (enough for its ``kv_len``; at most ``pages``).
        page_size: tokens per page.
        tokens, seqs, pages: the padded sizes ``T``, ``S``, ``J``.

    Raises:
        ValueError: the sequences do not fit the padded sizes, or a sequence's lengths or pages disagree.
    """
    count = len(q_lens)
    if not len(kv_lens) == len(page_tables) == count:
        raise ValueError(
            f"ragged_batch: {count} q_lens, {len(kv_lens)} kv_lens and {len(page_tables)} page tables"
        )
    if count > seqs or sum(q_lens) > tokens:
        raise ValueError(
            f"ragged_batch: {count} sequences of {sum(q_lens)} tokens exceed {seqs} slots of {tokens} tokens"
        )
    positions = np.full((tokens,), -1, np.int32)
    slots = np.full((tokens,), PADDING_SLOT, np.int32)
    table = np.zeros((seqs, pages), np.int32)
    cu = np.zeros((seqs + 1,), np.int32)
    lengths = np.zeros((seqs,), np.int32)
    start = 0
    for index, (q_len, kv_len, owned) in enumerate(zip(q_lens, kv_lens, page_tables)):
        if not 1 <= q_len <= kv_len or -(-kv_len // page_size) > len(owned) or len(owned) > pages:
            raise ValueError(
                f"ragged_batch: sequence {index} has q_len {q_len}, kv_len {kv_len} and {len(owned)} pages "
                f"(of at most {pages}, page_size {page_size})"
            )
        new = np.arange(kv_len - q_len, kv_len, dtype=np.int32)
        positions[start : start + q_len] = new
        owned_pages = np.asarray(owned, np.int32)
        slots[start : start + q_len] = owned_pages[new // page_size] * page_size + new % page_size
        table[index, : len(owned)] = owned_pages
        lengths[index] = kv_len
        start += q_len
        cu[index + 1] = start
    cu[count + 1 :] = start
    return RaggedBatch(positions, slots, table, cu, lengths, np.asarray(count, np.int32))


def token_sequences(
    cu_q_lens: Int[Array, " S1"], kv_lens: Int[Array, " S"], num_seqs: Int[Array, ""], num_tokens: int
) -> tuple[Int[Array, " T"], Int[Array, " T"]]:
    """Each flat token's sequence slot and position, inside a program (for kernels).

    Returns:
        ``(sequence [T], position [T])``: a padding token's sequence is clipped to a valid slot and its
        position is ``-1``.
    """
    index = jnp.arange(num_tokens, dtype=jnp.int32)
    sequence = jnp.searchsorted(cu_q_lens[1:], index, side="right").astype(jnp.int32)
    sequence = jnp.minimum(sequence, kv_lens.shape[0] - 1)
    q_len = cu_q_lens[sequence + 1] - cu_q_lens[sequence]
    position = kv_lens[sequence] - q_len + index - cu_q_lens[sequence]
    real = index < cu_q_lens[num_seqs]
    return sequence, jnp.where(real, position, -1)


def slot_pages(slots: jax.Array, page_size: int, num_pages: int) -> tuple[jax.Array, jax.Array]:
    """``(page, offset)`` of each slot; a padding slot's page is ``num_pages``, past the pool (a scatter
    with ``mode="drop"`` stores nothing there; -1 would wrap around to the last page)."""
    real = slots >= 0
    return jnp.where(real, slots // page_size, num_pages), jnp.where(real, slots % page_size, 0)
