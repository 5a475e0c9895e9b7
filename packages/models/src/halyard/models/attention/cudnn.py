"""Attention through cuDNN's fused flash-attention kernel (NVIDIA GPUs only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Shaped

from halyard.models.attention.layout import FlatAttention, flat_visible

CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
"""Element types cuDNN's fused attention accepts."""
CUDNN_MAX_HEAD_SIZE = 128


def has_nvidia_gpu() -> bool:
    """Whether JAX's default backend is an NVIDIA GPU (CUDA)."""
    try:
        devices = jax.devices()
    except RuntimeError:
        return False
    if not devices or devices[0].platform not in ("gpu", "cuda"):
        return False
    # ROCm GPUs also report platform "gpu"; cuDNN exists only on NVIDIA hardware.
    return "nvidia" in devices[0].device_kind.lower()


def cudnn_unsupported_reason(flat: FlatAttention) -> str | None:
    """Why cuDNN cannot run these inputs, or None when it can (used by ``auto`` and for errors)."""
    if not has_nvidia_gpu():
        return f"cuDNN attention needs an NVIDIA GPU, but JAX's default backend is {jax.default_backend()!r}"
    if flat.query.dtype not in CUDNN_DTYPES:
        return (
            f"cuDNN attention takes bfloat16 or float16 inputs, got {flat.query.dtype} (cast, or use 'xla')"
        )
    head_size = flat.query.shape[-1]
    if head_size > CUDNN_MAX_HEAD_SIZE or head_size % 8:
        return (
            f"cuDNN attention needs head_size <= {CUDNN_MAX_HEAD_SIZE} and a multiple of 8, got {head_size}"
        )
    return None


def cudnn_attention(flat: FlatAttention, *, scale: float) -> Shaped[Array, "batch pos heads head_size"]:
    """Attention of plain-array inputs via ``jax.nn.dot_product_attention(implementation="cudnn")``.

    A plain causal (optionally sliding-window) mask with default positions uses cuDNN's built-in causal
    masking, which also skips the hidden half of the work; unmasked attention passes no mask; any other
    mask (segments, positions, padding) is passed as a boolean mask, with odd lengths padded to even.

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        scale: the logit multiplier.

    Returns:
        ``[batch, pos, heads, head_size]``; rows that see no key are zeros.

    Raises:
        ValueError: no NVIDIA GPU, or a dtype / head size cuDNN does not support (the message says which).
    """
    reason = cudnn_unsupported_reason(flat)
    if reason is not None:
        raise ValueError(f"attention(implementation='cudnn'): {reason}. Use 'auto', 'xla' or 'blocked'.")
    num_queries, num_keys = flat.query.shape[1], flat.key.shape[1]
    per_token_rules = flat.query_segments is not None or flat.key_valid is not None
    if not per_token_rules and not flat.causal and flat.sliding_window is None:
        return jax.nn.dot_product_attention(
            flat.query, flat.key, flat.value, scale=scale, implementation="cudnn"
        )
    plain_causal = flat.causal and not per_token_rules and num_queries == num_keys and flat.default_positions
    if plain_causal:
        window = None if flat.sliding_window is None else (flat.sliding_window - 1, 0)
        return jax.nn.dot_product_attention(
            flat.query,
            flat.key,
            flat.value,
            scale=scale,
            is_causal=True,
            local_window_size=window,
            implementation="cudnn",
        )
    mask = flat_visible(flat)
    # cuDNN's backward with a bias (our mask) needs even lengths: pad with hidden keys and dropped queries.
    query, key, value = flat.query, flat.key, flat.value
    padded_queries, padded_keys = num_queries + num_queries % 2, num_keys + num_keys % 2
    if (padded_queries, padded_keys) != (num_queries, num_keys):
        query = _pad_axis1(query, padded_queries)
        key, value = _pad_axis1(key, padded_keys), _pad_axis1(value, padded_keys)
        mask = jnp.pad(mask, ((0, 0), (0, padded_queries - num_queries), (0, padded_keys - num_keys)))
    output = jax.nn.dot_product_attention(
        query, key, value, mask=mask[:, None], scale=scale, implementation="cudnn"
    )
    output = jnp.where(jnp.any(mask, axis=-1)[:, :, None, None], output, jnp.zeros((), output.dtype))
    return output[:, :num_queries]


def _pad_axis1(array: jax.Array, length: int) -> jax.Array:
    return jnp.pad(array, ((0, 0), (0, length - array.shape[1]), (0, 0), (0, 0)))
