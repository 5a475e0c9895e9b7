"""Reference scaled dot-product attention over named axes.

Axes by role: queries have ``QPos`` and ``HeadSize`` (plus any of ``batch``, ``heads``, ...), keys and
values have ``KPos`` and ``HeadSize``. Every other axis matches by name, which gives grouped-query
attention for free: split query heads into ``(kv_heads, q_heads_per_group)`` and give keys / values only
``kv_heads``; each key head then serves its whole group.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from halyard.named.axis import AxisSelector, axis_name, format_axes
from halyard.named.broadcast import broadcast_to, union_axes
from halyard.named.contraction import dot
from halyard.named.core import NamedArray


def _with_key_positions(x: NamedArray, QPos: str, KPos: str, role: str) -> NamedArray:
    if x.has_axis(KPos):
        return x
    if x.has_axis(QPos):
        return x.rename({QPos: KPos})
    raise ValueError(f"dot_product_attention: {role} {format_axes(x.axes)} has neither {KPos!r} nor {QPos!r}")


def attention_weights(
    query: NamedArray,
    key: NamedArray,
    mask: NamedArray | None = None,
    *,
    QPos: AxisSelector = "pos",
    KPos: AxisSelector = "key_pos",
    HeadSize: AxisSelector = "head_size",
    scale: float | None = None,
    bias: NamedArray | None = None,
) -> NamedArray:
    """Softmax-normalised attention probabilities over ``KPos`` (computed in float32).

    Arguments as in `dot_product_attention`. Returns the query's axes without ``HeadSize``, plus
    ``KPos`` (and any axis only the key, mask or bias has), in float32, ordered ``(other axes..., QPos, KPos)``.
    A fully masked row gets uniform weights (finite, never NaN; its output is meaningless and should
    be excluded from the loss).
    """
    q_pos, k_pos, head_size = axis_name(QPos), axis_name(KPos), axis_name(HeadSize)
    query.axis_index(head_size)
    key = _with_key_positions(key, q_pos, k_pos, "key")
    if scale is None:
        scale = 1.0 / math.sqrt(query.axis_size(head_size))
    # Scores as (batch-like axes..., q_pos, k_pos): the layout of a batched matmul, so XLA adds no
    # transposes of the largest tensor of attention, and the softmax runs over the last dimension.
    batch_like = [a.name for a in union_axes(query, key) if a.name not in (head_size, q_pos, k_pos)]
    scores = dot(
        query, key, axis=head_size, out_axes=(*batch_like, q_pos, k_pos), preferred_element_type=jnp.float32
    )
    scores = scores.astype(jnp.float32) * scale
    if bias is not None:
        scores = (scores + bias.astype(jnp.float32)).rearrange(..., q_pos, k_pos)
    if mask is not None:
        if mask.dtype != jnp.bool_:
            raise TypeError(f"dot_product_attention: mask must be boolean (True = attend), got {mask.dtype}")
        # The mask may bring axes the scores lack (a batch axis from segment ids): broadcast by name,
        # new axes in front. A finite fill (not -inf) keeps fully masked rows NaN-free.
        extra = tuple(a for a in union_axes(scores, mask) if not scores.has_axis(a.name))
        target = extra + scores.axes
        filled = jnp.where(
            broadcast_to(mask, target, allow_extra=False).array,
            broadcast_to(scores, target).array,
            jnp.finfo(jnp.float32).min,
        )
        scores = NamedArray(filled, target)
    return NamedArray(jax.nn.softmax(scores.array, axis=-1), scores.axes)


def dot_product_attention(
    query: NamedArray,
    key: NamedArray,
    value: NamedArray,
    mask: NamedArray | None = None,
    *,
    QPos: AxisSelector = "pos",
    KPos: AxisSelector = "key_pos",
    HeadSize: AxisSelector = "head_size",
    scale: float | None = None,
    bias: NamedArray | None = None,
) -> NamedArray:
    """``softmax(query · key / sqrt(d) + bias, masked) · value`` over named axes.

    Args:
        query: e.g. ``(batch, pos, heads, head_size)``, or for GQA
            ``(batch, pos, kv_heads, q_heads_per_group, head_size)``.
        key: e.g. ``(batch, key_pos, heads, head_size)`` or ``(batch, key_pos, kv_heads, head_size)``;
            a key with ``QPos`` instead of ``KPos`` is renamed (self-attention convenience).
        value: like ``key``; its ``HeadSize`` may differ in size from the query's.
        mask: boolean NamedArray (True = attend) over any of the score axes, e.g. ``(pos, key_pos)``
            or ``(batch, pos, key_pos)``; see `halyard.named.nn.masks`.
        QPos, KPos, HeadSize: the names of the query-position, key-position and head-size axes.
        scale: multiplier of the scores; default ``1 / sqrt(head_size)`` (muP uses ``1 / head_size``).
        bias: added to the scores before masking (ALiBi and the like), float NamedArray.

    Returns:
        The query's axes (same order), with ``HeadSize`` sized as in ``value``; dtype of ``value``.

    Raises:
        KeyError: ``query`` has no ``HeadSize`` axis.
        ValueError: key / value lack a position axis, or a shared axis has two sizes (both arrays'
            axes are printed).
        TypeError: ``mask`` is not boolean.
    """
    q_pos, k_pos, head_size = axis_name(QPos), axis_name(KPos), axis_name(HeadSize)
    value = _with_key_positions(value, q_pos, k_pos, "value")
    weights = attention_weights(
        query, key, mask, QPos=q_pos, KPos=k_pos, HeadSize=head_size, scale=scale, bias=bias
    )
    out = dot(weights.astype(value.dtype), value, axis=k_pos)
    order = [a.name for a in query.axes] + [a.name for a in out.axes if not query.has_axis(a.name)]
    return out.rearrange(*order)
