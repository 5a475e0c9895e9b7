"""Attention through `jax.nn.dot_product_attention` (XLA's fused softmax path), mask materialised."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Shaped

from halyard.models.attention.layout import FlatAttention, flat_visible


def xla_attention(flat: FlatAttention, *, scale: float) -> Shaped[Array, "batch pos heads head_size"]:
    """Attention of plain-array inputs via ``jax.nn.dot_product_attention(implementation="xla")``.

    GQA uses JAX's native grouping (query head ``h`` reads kv head ``h // group``, as in Hugging Face).

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        scale: the logit multiplier.

    Returns:
        ``[batch, pos, heads, head_size]``; rows that see no key are zeros (JAX would otherwise average
        over the masked keys).
    """
    visible = flat_visible(flat)
    output = jax.nn.dot_product_attention(
        flat.query,
        flat.key,
        flat.value,
        mask=visible[:, None, :, :],
        scale=scale,
        implementation="xla",
    )
    sees_any_key = jnp.any(visible, axis=-1)[:, :, None, None]
    return jnp.where(sees_any_key, output, jnp.zeros((), output.dtype))
