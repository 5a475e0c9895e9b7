"""The reference attention: the textbook formula over named axes, with the mask materialised.

Quadratic memory in sequence length; every other implementation is tested against this one.
"""

from __future__ import annotations

import jax.numpy as jnp

import halyard.named as hn
from halyard.models.attention.mask import AttentionMask
from halyard.named import Axis, NamedArray


def reference_attention(
    query: NamedArray,
    key: NamedArray,
    value: NamedArray,
    mask: AttentionMask,
    *,
    scale: float,
    logit_softcap: float | None = None,
) -> NamedArray:
    """``softmax(softcap(scale * q . k) + mask) . v`` with the softmax in float32.

    Args:
        query: ``(batch..., "pos", "heads", "head_size")``.
        key: ``(batch..., "key_pos", "kv_heads", "head_size")``.
        value: ``(batch..., "key_pos", "kv_heads", "head_size")``.
        mask: which keys each query sees; materialised as a ``[pos, key_pos]`` matrix.
        scale: the logit multiplier (``1/sqrt(head_size)`` for standard attention).
        logit_softcap: ``cap``: the scaled logits become ``cap * tanh(logits / cap)`` before the mask
            (Gemma 2); None: no capping.

    Returns:
        ``(batch..., "pos", "heads", "head_size")`` in the query's axis order and dtype; rows that see
        no key are zeros.
    """
    num_kv_heads = key.axis_size("kv_heads")
    grouped_query = _split_heads(query, num_kv_heads)
    logits = hn.dot(grouped_query, key, axis="head_size", preferred_element_type=jnp.float32) * scale
    if logit_softcap is not None:
        logits = logit_softcap * hn.tanh(logits / logit_softcap)
    visible = mask.materialize(query.axis("pos"), key.axis("key_pos"))
    masked_logits = hn.where(visible, logits.astype(jnp.float32), -jnp.inf)
    row_max = hn.max(masked_logits, "key_pos")
    safe_max = hn.where(hn.isfinite(row_max), row_max, 0.0)
    weights = hn.where(visible, hn.exp(masked_logits - safe_max), 0.0)
    total = hn.sum(weights, "key_pos")
    probabilities = weights / hn.where(total > 0, total, 1.0)
    output = hn.dot(probabilities, value.astype(jnp.float32), axis="key_pos")
    merged = _merge_heads(output, query.axis("heads"))
    return merged.rearrange(*query.axis_names).astype(query.dtype)


def _split_heads(query: NamedArray, num_kv_heads: int) -> NamedArray:
    """``heads`` -> ``(kv_heads, group)``: query head ``h`` belongs to kv head ``h // group``."""
    ordered = query.rearrange(..., "heads", "head_size")
    num_heads = query.axis_size("heads")
    group = num_heads // num_kv_heads
    array = ordered.array.reshape((*ordered.array.shape[:-2], num_kv_heads, group, ordered.array.shape[-1]))
    axes = (*ordered.axes[:-2], Axis("kv_heads", num_kv_heads), Axis("group", group), ordered.axes[-1])
    return NamedArray(array, axes)


def _merge_heads(output: NamedArray, Heads: Axis) -> NamedArray:
    ordered = output.rearrange(..., "kv_heads", "group", "head_size")
    array = ordered.array.reshape((*ordered.array.shape[:-3], Heads.size, ordered.array.shape[-1]))
    return NamedArray(array, (*ordered.axes[:-3], Heads, ordered.axes[-1]))
