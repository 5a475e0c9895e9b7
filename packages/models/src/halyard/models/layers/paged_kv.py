"""`PagedKV`: keys and values of many sequences in fixed-size pages (an inference engine's KV memory).

The engine (`halyard.serve`) owns a pool of pages per layer and a page table per sequence; the model only
sees the pages of the rows it runs. In each layer the paged kernel (`halyard.models.attention.paged`) walks a
row's pages in position order, each read from the whole pool as it is reached, with this call's new keys laid
over their positions: the training kernel's arithmetic over the same key blocks, only where the keys come
from differs. The new keys and values come back from the layer scan, and `PagedKV.written` stores them in
their pages once, in a program of their own.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jax.typing import ArrayLike

from halyard.models.attention.paged import paged_attention
from halyard.named import Axis, NamedArray, named

PAGE = "page"
PAGE_SLOT = "page_slot"
SEQ_PAGE = "seq_page"
KEY_AXES = ("layers", PAGE, "kv_heads", "head_size", PAGE_SLOT)
"""How the key pool is laid out: a page's keys of one head are ``head_size x page_slot``, the operand of the
attention logits' product as it is read (no transposed copy of each page a step)."""
VALUE_AXES = ("layers", PAGE, "kv_heads", PAGE_SLOT, "head_size")
"""How the value pool is laid out: a page's values of one head are ``page_slot x head_size``."""


class PagedKV(eqx.Module):
    """A pool of key/value pages and the pages of the rows of one call.

    Attributes:
        key_pages, value_pages: laid out as `KEY_AXES` and `VALUE_AXES`.
        page_table: int32 ``(batch, seq_page)``: the pages of each row's sequence in order (page ``i``
            holds positions ``i * page_size ...``); entries past the sequence's end may be any page (the
            causal mask hides what they hold).
        write_positions: int32 ``(batch, pos)``: the position each of this call's tokens is stored at
            (its token position); any value ``>= seq_page * page_size`` for a padding token (never stored).
    """

    key_pages: NamedArray
    value_pages: NamedArray
    page_table: NamedArray
    write_positions: NamedArray

    @classmethod
    def zeros(
        cls,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: jnp.dtype,
    ) -> PagedKV:
        """An empty pool (with an empty page table: set one with `for_rows` before a call).

        Args:
            num_layers, num_pages, page_size, num_kv_heads, head_size: the axis sizes.
            dtype: the dtype keys and values are stored in (the model's compute dtype).
        """
        sizes = {
            "layers": num_layers, PAGE: num_pages, PAGE_SLOT: page_size, "kv_heads": num_kv_heads,
            "head_size": head_size,
        }  # fmt: skip

        def pool(names: tuple[str, ...]) -> NamedArray:
            axes = tuple(Axis(name, sizes[name]) for name in names)
            return NamedArray(jnp.zeros(tuple(a.size for a in axes), dtype), axes)

        return cls(pool(KEY_AXES), pool(VALUE_AXES), *_no_rows())

    def without_rows(self) -> PagedKV:
        """The pool alone (an empty page table), as it is kept between calls."""
        return PagedKV(self.key_pages, self.value_pages, *_no_rows())

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self.key_pages.axis_size(PAGE_SLOT)

    def for_rows(self, page_table: ArrayLike, write_positions: ArrayLike) -> PagedKV:
        """This pool with the rows of the next call.

        Args:
            page_table: int ``[batch, seq_page]`` (see the class docstring).
            write_positions: int ``[batch, pos]``, one entry per token of the call.
        """
        table = named(jnp.asarray(page_table, jnp.int32), ("batch", SEQ_PAGE))
        writes = named(jnp.asarray(write_positions, jnp.int32), ("batch", "pos"))
        return PagedKV(self.key_pages, self.value_pages, table, writes)

    def for_layer_scan(self) -> PagedLayers:
        """What the layer scan takes: the pool whole (every layer reads its own pages straight from it, one
        gather; a slice of the pool per layer would be copied out first), and each layer's index."""
        layers = self.key_pages.axis("layers")
        whole: dict[Axis | str, str | Axis] = {"layers": POOL_LAYER}
        return PagedLayers(
            self.key_pages.rename(whole),
            self.value_pages.rename(whole),
            NamedArray(jnp.arange(layers.size, dtype=jnp.int32), (layers,)),
            self.page_table,
            self.write_positions,
        )

    def written(self, new_keys: NamedArray, new_values: NamedArray) -> PagedKV:
        """The pool with every layer's new keys and values stored in their pages.

        Args:
            new_keys, new_values: ``(layers, batch, key_pos, kv_heads, head_size)``: the new keys and values
                each layer's `PagedLayers.attend` was given.
        """
        table = self.page_table.array
        positions = self.write_positions.array
        seq_pages = table.shape[1]
        page_of = jnp.take_along_axis(table, jnp.clip(positions // self.page_size, 0, seq_pages - 1), axis=1)
        slot = jnp.where(positions < seq_pages * self.page_size, positions % self.page_size, self.page_size)
        page_of, slot = page_of.reshape(-1), slot.reshape(-1)  # a padding token's slot is past the page

        def store(pages: NamedArray, new: NamedArray) -> NamedArray:
            names = pages.axis_names
            index = tuple(page_of if n == PAGE else slot if n == PAGE_SLOT else slice(None) for n in names)
            # the page and slot indices are not adjacent, so the indexed entries come first, then the
            # pool's other axes in its order
            rest = [n for n in names if n not in (PAGE, PAGE_SLOT)]
            fresh = new.rearrange("batch", "key_pos", *rest).array
            fresh = fresh.reshape(-1, *fresh.shape[2:]).astype(pages.dtype)
            return NamedArray(pages.array.at[index].set(fresh, mode="drop"), pages.axes)

        return PagedKV(
            store(self.key_pages, new_keys),
            store(self.value_pages, new_values),
            self.page_table,
            self.write_positions,
        )


POOL_LAYER = "pool_layer"
"""The pool's layer axis inside the layer scan (not ``layers``: the scan would slice it)."""


class PagedLayers(eqx.Module):
    """The pool as the layer scan sees it (`PagedKV.for_layer_scan`): inside the scan ``layer`` is this
    layer's index and the pools are whole.

    Attributes:
        key_pool, value_pool: as `KEY_AXES` and `VALUE_AXES`, with ``pool_layer`` for ``layers``.
        layer: int32 ``(layers,)``, a scalar in each layer.
        page_table, write_positions: as in `PagedKV`.
    """

    key_pool: NamedArray
    value_pool: NamedArray
    layer: NamedArray
    page_table: NamedArray
    write_positions: NamedArray

    def attend(
        self,
        query: NamedArray,
        new_keys: NamedArray,
        new_values: NamedArray,
        query_positions: NamedArray,
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> NamedArray:
        """This layer's attention of the call's queries over their rows' pages and the call's new keys,
        reading each page from the pool as the kernel reaches it (`halyard.models.attention.paged`).

        Args:
            query: ``(batch, pos, heads, head_size)``.
            new_keys, new_values: ``(batch, key_pos, kv_heads, head_size)``, one per query.
            query_positions: ``(batch, pos)``; -1 for padding.
            scale, sliding_window, logit_softcap: the attention's settings.

        Returns:
            ``(batch, pos, heads, head_size)`` in the query's axis order.
        """
        ordered = query.rearrange("batch", "pos", "heads", "head_size")
        output = paged_attention(
            ordered.array,
            query_positions.rearrange("batch", "pos").array,
            self.key_pool.rearrange(POOL_LAYER, *KEY_AXES[1:]).array,
            self.value_pool.rearrange(POOL_LAYER, *VALUE_AXES[1:]).array,
            self.layer.array,
            self.page_table.array,
            new_keys.rearrange("batch", "key_pos", "kv_heads", "head_size").array,
            new_values.rearrange("batch", "key_pos", "kv_heads", "head_size").array,
            self.write_positions.rearrange("batch", "pos").array,
            scale=scale,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
            block_size=self.key_pool.axis_size(PAGE_SLOT),
        )
        return NamedArray(output, ordered.axes).rearrange(*query.axis_names)


def _no_rows() -> tuple[NamedArray, NamedArray]:
    table = NamedArray(jnp.zeros((0, 0), jnp.int32), (Axis("batch", 0), Axis(SEQ_PAGE, 0)))
    writes = NamedArray(jnp.zeros((0, 0), jnp.int32), (Axis("batch", 0), Axis("pos", 0)))
    return table, writes
