"""How a model's kv heads and query heads sit in the rows and lanes of JAX's Pallas ragged paged attention
kernel (`halyard.models.attention.ragged_paged_pallas`).

The kernel takes heads of a multiple of 128 lanes (the TPU's vector width), ``2 * rows`` interleaved
key/value rows a token that the TPU tiles whole (1, 2 or 4 rows or a multiple of 4 for float32; 1, 2, 4 or
8 or a multiple of 8 for bfloat16), and query groups (query heads per row) it folds into 8-row tiles. A
model's heads are fitted to that without wasting the pool's memory where it can be helped:

- **kv heads side by side in the lanes**: heads smaller than 128 share a row, ``heads_per_row`` of them
  (``128 // head_size`` at most, a divisor of the kv heads): Qwen2.5-0.5B's 2 kv heads of 64 fill one row
  of 128 lanes. A query of head ``j`` of the row is placed in head ``j``'s lanes, zeros elsewhere, so its
  logits are its own head's; its output is read from the same lanes. What does not pack is zero-padded to
  128 lanes (1 kv head of 64: twice its memory).
- **rows padded** to a count the TPU tiles (3 rows become 4): the padded rows hold zero keys and values
  and have no queries.
- **query groups padded** (`padded_query_group`): a row's query heads (``heads_per_row x`` the model's
  group) padded with zero queries to 1, 2, 4, 8 or a multiple of 8; their outputs are dropped. A decode step
  reads each key once whatever the group, so this costs arithmetic, not memory traffic.

Every placement is a pad, a select or a reshape: exact in any dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float

LANES = 128
"""The TPU's lanes: the kernel's head size is a multiple of it."""


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where a model's heads sit in the kernel's rows (module docstring). Static: Python ints.

    Attributes:
        kv_heads, head_size: the model's.
        heads_per_row: kv heads side by side in one row's lanes.
        rows: the kernel's kv heads (``kv_heads // heads_per_row``, padded to a count the TPU tiles).
        lanes: a row's lanes (a multiple of 128).
    """

    kv_heads: int
    head_size: int
    heads_per_row: int
    rows: int
    lanes: int

    @classmethod
    def for_heads(cls, kv_heads: int, head_size: int, dtype: Any) -> RowLayout:
        """The layout of ``kv_heads`` heads of ``head_size`` in a pool of ``dtype`` (float32 or bfloat16)."""
        packed = max(
            (count for count in range(1, LANES // head_size + 1) if kv_heads % count == 0), default=1
        )
        lanes = -(-packed * head_size // LANES) * LANES
        rows = kv_heads // packed
        while not _tiled_whole(2 * rows, 4 // jnp.dtype(dtype).itemsize):
            rows += 1
        return cls(kv_heads, head_size, packed, rows, lanes)

    @property
    def used_rows(self) -> int:
        """The rows that hold a model's heads (the rest are padding)."""
        return self.kv_heads // self.heads_per_row

    @property
    def used_lanes(self) -> int:
        """The lanes of a row that hold a model's heads."""
        return self.heads_per_row * self.head_size

    def kernel_rows(
        self, keys: Float[Array, "T h d"], values: Float[Array, "T h d"]
    ) -> Float[Array, "T rows2 lanes"]:
        """Each token's keys and values as the pool stores them: ``[T, 2 * rows, lanes]``, row ``2 r`` the
        keys of row ``r``'s heads side by side, ``2 r + 1`` their values."""
        tokens = keys.shape[0]
        pad = ((0, 0), (0, self.rows - self.used_rows), (0, self.lanes - self.used_lanes))
        packed_keys = jnp.pad(keys.reshape(tokens, self.used_rows, self.used_lanes), pad)
        packed_values = jnp.pad(values.reshape(tokens, self.used_rows, self.used_lanes), pad)
        return jnp.stack([packed_keys, packed_values], axis=2).reshape(tokens, 2 * self.rows, self.lanes)

    def kernel_queries(self, query: Float[Array, "T Hq d"]) -> Float[Array, "T heads lanes"]:
        """The queries as the kernel takes them: ``[T, rows * padded group, lanes]``, each query in its kv
        head's lanes of its row, zeros elsewhere."""
        tokens, query_heads, _ = query.shape
        group = query_heads // self.kv_heads
        per_row = self.heads_per_row
        # [T, row, j, g, d] -> [T, row, j, g, k, d]: the query of the row's head j in lane slot k == j
        split = query.reshape(tokens, self.used_rows, per_row, group, 1, self.head_size)
        placed = jnp.where(_diagonal(per_row), split, jnp.zeros((), query.dtype))
        placed = placed.reshape(tokens, self.used_rows, per_row * group, self.used_lanes)
        padded_group = padded_query_group(per_row * group)
        pad = (
            (0, 0),
            (0, self.rows - self.used_rows),
            (0, padded_group - per_row * group),
            (0, self.lanes - self.used_lanes),
        )
        return jnp.pad(placed, pad).reshape(tokens, self.rows * padded_group, self.lanes)

    def model_outputs(
        self, output: Float[Array, "T heads lanes"], query_heads: int
    ) -> Float[Array, "T Hq d"]:
        """The kernel's outputs for `kernel_queries`'s queries back as ``[T, query_heads, head_size]``."""
        tokens = output.shape[0]
        group, per_row = query_heads // self.kv_heads, self.heads_per_row
        rows = output.reshape(tokens, self.rows, -1, self.lanes)
        rows = rows[:, : self.used_rows, : per_row * group, : self.used_lanes]
        slots = rows.reshape(tokens, self.used_rows, per_row, group, per_row, self.head_size)
        own = jnp.diagonal(slots, axis1=2, axis2=4)  # [T, row, g, d, j]: each query's own lane slot
        return own.transpose(0, 1, 4, 2, 3).reshape(tokens, query_heads, self.head_size)


def padded_query_group(group: int) -> int:
    """The query heads per row the kernel is given for ``group``: a power of two up to 8, else a multiple of
    8. JAX's kernel folds a row's query heads into the rows of one matmul operand, which the TPU tiles by 8;
    JAX tests the groups 1, 2, 4 and 8, and its tests note that 12 query heads on 2 kv heads (6) fail to
    compile."""
    if group <= 8:
        return 1 << (group - 1).bit_length()
    return -(-group // 8) * 8


def _tiled_whole(rows: int, packing: int) -> bool:
    """Whether the TPU tiles ``rows`` rows of a type ``packing`` of which fill 32 bits without padding (JAX's
    kernel refuses other counts: its ``get_min_heads_per_blk``)."""
    if rows % packing:
        return False
    rows //= packing
    return rows in (1, 2, 4, 8) or rows % 8 == 0


def _diagonal(size: int) -> jnp.ndarray:
    """``[size, 1, size, 1]`` booleans, true where the two ``size`` axes are equal."""
    return jnp.eye(size, dtype=bool)[:, None, :, None]
