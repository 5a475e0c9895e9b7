"""`PagedKV`: keys and values of many sequences in fixed-size pages (an inference engine's KV memory).

The engine (`halyard.serve`) owns a pool of pages for every layer, laid out as its ragged paged kernel
wants it (`halyard.models.attention.ragged_paged`), and runs one flat batch of tokens a step
(`CausalLM.paged_step`). In each layer the step's new keys and values are first stored in their pages
(the pool travels through the layer scan as part of its carry, so the program that donates it writes it in
place), then the kernel attends over each sequence's pages.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.attention.ragged_paged import RaggedBatch, RaggedPagedKernel
from halyard.named import Axis, NamedArray


class PagedKV(eqx.Module):
    """A pool of key/value pages, its kernel, and the layout of the step it runs (if any).

    Attributes:
        pool: the kernel's pool (`RaggedPagedKernel.init_pool`): NamedArrays whose first axis is ``layers``.
        kernel: the ragged paged kernel (static).
        page_size: tokens per page (static).
        batch: the step's `RaggedBatch` (jax arrays), or None between steps.
    """

    pool: Any
    kernel: RaggedPagedKernel = eqx.field(static=True)
    page_size: int = eqx.field(static=True)
    batch: RaggedBatch | None = None

    @classmethod
    def zeros(
        cls,
        *,
        kernel: RaggedPagedKernel,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: jnp.dtype,
    ) -> PagedKV:
        """An empty pool (no step: set one with `for_step` before a call).

        Args:
            kernel: the ragged paged kernel (`halyard.models.attention.dispatch.paged_kernel`).
            num_layers, num_pages, page_size, num_kv_heads, head_size: the axis sizes.
            dtype: the dtype keys and values are stored in (the model's compute dtype).
        """
        pool = kernel.init_pool(num_layers, num_pages, page_size, num_kv_heads, head_size, dtype)
        return cls(pool, kernel, page_size)

    def for_step(self, batch: RaggedBatch) -> PagedKV:
        """This pool with the layout of the next step (its arrays as the program takes them)."""
        return PagedKV(self.pool, self.kernel, self.page_size, RaggedBatch(*(jnp.asarray(a) for a in batch)))

    def with_pool(self, pool: Any) -> PagedKV:
        """The same step over ``pool`` (the layer scan's result)."""
        return PagedKV(pool, self.kernel, self.page_size, self.batch)

    def without_step(self) -> PagedKV:
        """The pool alone, as it is kept between steps."""
        return PagedKV(self.pool, self.kernel, self.page_size)

    def for_layer_scan(self) -> PagedLayer:
        """What every layer of the scan takes besides the pool (which travels in the carry): the kernel, the
        step's layout, what the kernel reads of it (`RaggedPagedKernel.prepare`, computed here, once a step)
        and the layer's index (an array along ``layers``: the scan slices it)."""
        batch = self.batch
        if batch is None:
            raise ValueError("PagedKV: no step is set; call for_step(batch) first")
        layers = jnp.arange(_num_layers(self.pool), dtype=jnp.int32)
        step = self.kernel.prepare(
            self.pool,
            batch.page_table,
            batch.cu_q_lens,
            batch.kv_lens,
            batch.num_seqs,
            tokens=batch.slots.shape[0],
        )
        return PagedLayer(self.kernel, batch, step, NamedArray(layers, (Axis("layers", layers.shape[0]),)))


def _num_layers(pool: Any) -> int:
    leaf = jax.tree.leaves(pool, is_leaf=lambda x: isinstance(x, NamedArray))[0]
    return leaf.axis_size("layers")


class PagedLayer(eqx.Module):
    """One layer's view of a step over the pool (`PagedKV.for_layer_scan`).

    Attributes:
        kernel: the ragged paged kernel (static).
        batch: the step's layout.
        step: what the kernel reads of it (`RaggedPagedKernel.prepare`).
        layer: int32, ``(layers,)`` outside the scan and a scalar inside (this layer's index).
    """

    kernel: RaggedPagedKernel = eqx.field(static=True)
    batch: RaggedBatch
    step: Any
    layer: NamedArray

    def attend(
        self,
        pool: Any,
        query: NamedArray,
        new_keys: NamedArray,
        new_values: NamedArray,
        *,
        scale: float,
        sliding_window: int | None,
        logit_softcap: float | None,
    ) -> tuple[NamedArray, Any]:
        """Store this layer's new keys and values in ``pool``, then attend the step's queries over it.

        Args:
            pool: the pool (the layer scan's carry).
            query: ``(pos, heads, head_size)``, one per token of the step.
            new_keys, new_values: ``(key_pos, kv_heads, head_size)``, one per token.
            scale, sliding_window, logit_softcap: the attention's settings.

        Returns:
            ``(output (pos, heads, head_size) in the query's axis order, the pool)``.
        """
        batch, layer = self.batch, self.layer.array
        keys = new_keys.rearrange("key_pos", "kv_heads", "head_size").array
        values = new_values.rearrange("key_pos", "kv_heads", "head_size").array
        pool = self.kernel.write(pool, layer, keys, values, batch.slots)
        ordered = query.rearrange("pos", "heads", "head_size")
        output = self.kernel.attend(
            ordered.array,
            pool,
            layer,
            self.step,
            scale=scale,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
        )
        return NamedArray(output, ordered.axes).rearrange(*query.axis_names), pool
