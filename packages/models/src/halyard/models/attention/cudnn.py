"""Attention through cuDNN's fused flash-attention kernel (NVIDIA GPUs only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

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


def cudnn_attention(flat: FlatAttention, *, scale: float) -> jax.Array:
    """Attention of plain-array inputs via ``jax.nn.dot_product_attention(implementation="cudnn")``.

    A plain causal (optionally sliding-window) mask with default positions uses cuDNN's built-in causal
    masking, which also skips the hidden half of the work; any other mask (segments, positions, padding)
    is passed as a boolean mask.

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
    plain_causal = (
        flat.causal
        and flat.query_segments is None
        and flat.key_valid is None
        and num_queries == num_keys
        and flat.default_positions
    )
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
    output = jax.nn.dot_product_attention(
        flat.query, flat.key, flat.value, mask=mask[:, None], scale=scale, implementation="cudnn"
    )
    return jnp.where(jnp.any(mask, axis=-1)[:, :, None, None], output, jnp.zeros((), output.dtype))
