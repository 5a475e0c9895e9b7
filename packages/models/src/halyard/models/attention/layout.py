"""From named attention inputs to the plain-array layout every kernel shares, and back.

Kernels work on ``query[batch, pos, heads, head_size]`` and ``key/value[batch, key_pos, kv_heads,
head_size]`` with all batch-like axes flattened into one, and on the mask as per-token arrays
(positions, segment ids, key validity) of shape ``[batch, pos]`` / ``[batch, key_pos]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, Shaped

import halyard.named as hn
from halyard.models.attention.mask import AttentionMask
from halyard.named import Axis, NamedArray

POS = "pos"
KEY_POS = "key_pos"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_SIZE = "head_size"


@dataclass(frozen=True)
class FlatAttention:
    """Attention inputs as plain arrays (see the module docstring for shapes).

    ``query_segments``, ``key_segments`` and ``key_valid`` are None when the mask does not use them;
    positions are always present (``arange`` by default; ``default_positions`` says both are).
    """

    query: Shaped[Array, "batch pos heads head_size"]
    key: Shaped[Array, "batch key_pos kv_heads head_size"]
    value: Shaped[Array, "batch key_pos kv_heads head_size"]
    query_positions: Int[Array, "batch pos"]
    key_positions: Int[Array, "batch key_pos"]
    query_segments: Int[Array, "batch pos"] | None
    key_segments: Int[Array, "batch key_pos"] | None
    key_valid: Bool[Array, "batch key_pos"] | None
    causal: bool
    sliding_window: int | None
    default_positions: bool
    batch_axes: tuple[Axis, ...]
    query_axes: tuple[Axis, ...]


def flatten_inputs(
    query: NamedArray, key: NamedArray, value: NamedArray, mask: AttentionMask
) -> FlatAttention:
    """Check the named inputs and lay them out as plain arrays.

    Raises:
        ValueError: a required axis is missing, batch axes of query and key differ, head counts do not
            divide, or a mask array has an axis that the inputs lack.
    """
    for name, array, needed in (
        ("query", query, (POS, HEADS, HEAD_SIZE)),
        ("key", key, (KEY_POS, KV_HEADS, HEAD_SIZE)),
        ("value", value, (KEY_POS, KV_HEADS, HEAD_SIZE)),
    ):
        missing = [axis for axis in needed if not array.has_axis(axis)]
        if missing:
            raise ValueError(
                f"attention: {name} has axes {array.axis_names} but lacks {missing}; expected "
                f"(batch..., {', '.join(repr(a) for a in needed)})"
            )
    batch_axes = tuple(a for a in query.axes if a.name not in (POS, HEADS, HEAD_SIZE))
    for name, array in (("key", key), ("value", value)):
        other = tuple(a for a in array.axes if a.name not in (KEY_POS, KV_HEADS, HEAD_SIZE))
        if sorted(other, key=lambda a: a.name) != sorted(batch_axes, key=lambda a: a.name):
            raise ValueError(
                f"attention: {name}'s batch axes {other} differ from the query's {batch_axes}; "
                "query, key and value must share their batch axes (names and sizes)"
            )
    if key.axis(KEY_POS) != value.axis(KEY_POS) or key.axis(KV_HEADS) != value.axis(KV_HEADS):
        raise ValueError(
            f"attention: key {key.axes} and value {value.axes} must agree on key_pos and kv_heads"
        )
    for name, array in (("key", key), ("value", value)):
        if array.axis_size(HEAD_SIZE) != query.axis_size(HEAD_SIZE):
            raise ValueError(
                f"attention: {name} has head_size {array.axis_size(HEAD_SIZE)} but the query has "
                f"{query.axis_size(HEAD_SIZE)}"
            )
    num_heads, num_kv_heads = query.axis_size(HEADS), key.axis_size(KV_HEADS)
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"attention: heads ({num_heads}) must be a multiple of kv_heads ({num_kv_heads}) for "
            "grouped-query attention"
        )
    batch_names = [a.name for a in batch_axes]
    num_batch = math.prod(a.size for a in batch_axes)
    QPos, KeyPos = query.axis(POS), key.axis(KEY_POS)

    def plain(array: NamedArray, *names: str) -> jax.Array:
        flat = array.rearrange(*batch_names, *names).array
        return flat.reshape((num_batch, *flat.shape[len(batch_names) :]))

    def per_token(array: NamedArray | None, Pos: Axis, field: str) -> jax.Array | None:
        if array is None:
            return None
        extra = [a for a in array.axis_names if a not in batch_names and a != Pos.name]
        if extra or not array.has_axis(Pos.name) or array.axis_size(Pos.name) != Pos.size:
            raise ValueError(
                f"AttentionMask.{field} has axes {array.axes}; expected a subset of the batch axes "
                f"{batch_axes} plus {Pos}"
            )
        full = hn.broadcast_to(array, (*batch_axes, Pos))
        return full.array.reshape(num_batch, Pos.size)

    def positions(array: NamedArray | None, Pos: Axis, field: str) -> jax.Array:
        given = per_token(array, Pos, field)
        if given is None:
            return jnp.broadcast_to(jnp.arange(Pos.size, dtype=jnp.int32), (num_batch, Pos.size))
        return given.astype(jnp.int32)

    query_segments = per_token(mask.segment_ids, QPos, "segment_ids")
    key_segment_array = mask.resolved_key_segment_ids(QPos, KeyPos)
    if key_segment_array is not None and mask.segment_ids is None:
        raise ValueError("AttentionMask.key_segment_ids is set but segment_ids is not: set both")
    key_segments = per_token(key_segment_array, KeyPos, "key_segment_ids")
    key_valid = per_token(mask.key_valid, KeyPos, "key_valid")
    return FlatAttention(
        query=plain(query, POS, HEADS, HEAD_SIZE),
        key=plain(key, KEY_POS, KV_HEADS, HEAD_SIZE),
        value=plain(value, KEY_POS, KV_HEADS, HEAD_SIZE),
        query_positions=positions(mask.query_positions, QPos, "query_positions"),
        key_positions=positions(mask.key_positions, KeyPos, "key_positions"),
        query_segments=query_segments,
        key_segments=key_segments,
        key_valid=None if key_valid is None else key_valid.astype(bool),
        causal=mask.causal,
        sliding_window=mask.sliding_window,
        default_positions=mask.query_positions is None and mask.key_positions is None,
        batch_axes=batch_axes,
        query_axes=query.axes,
    )


def unflatten_output(flat: FlatAttention, output: Shaped[Array, "batch pos heads head_size"]) -> NamedArray:
    """``output[batch, pos, heads, head_size]`` back to the query's named axes and order."""
    by_name = {a.name: a for a in flat.query_axes}
    axes = (*flat.batch_axes, by_name[POS], by_name[HEADS], by_name[HEAD_SIZE])
    shaped = output.reshape(tuple(a.size for a in axes))
    return NamedArray(shaped, axes).rearrange(*(a.name for a in flat.query_axes))


def visible(
    query_positions: Int[Array, "batch q"],
    key_positions: Int[Array, "batch k"],
    query_segments: Int[Array, "batch q"] | None,
    key_segments: Int[Array, "batch k"] | None,
    key_valid: Bool[Array, "batch k"] | None,
    *,
    causal: bool,
    sliding_window: int | None,
) -> Bool[Array, "batch q k"]:
    """The mask rule on plain per-token arrays: ``[batch, q]`` and ``[batch, k]`` -> bool ``[batch, q, k]``.

    Used block by block by the blocked kernel and once by the xla/cudnn kernels.
    """
    q = query_positions[:, :, None]
    k = key_positions[:, None, :]
    result = jnp.ones((q.shape[0], q.shape[1], k.shape[2]), dtype=bool)
    if causal:
        result = result & (k <= q)
    if sliding_window is not None:
        result = result & (k > q - sliding_window)
    if query_segments is not None and key_segments is not None:
        result = result & (query_segments[:, :, None] == key_segments[:, None, :])
    if key_valid is not None:
        result = result & key_valid[:, None, :]
    return result


def flat_visible(flat: FlatAttention) -> Bool[Array, "batch pos key_pos"]:
    """The full ``[batch, pos, key_pos]`` mask of ``flat`` (quadratic memory)."""
    return visible(
        flat.query_positions,
        flat.key_positions,
        flat.query_segments,
        flat.key_segments,
        flat.key_valid,
        causal=flat.causal,
        sliding_window=flat.sliding_window,
    )
