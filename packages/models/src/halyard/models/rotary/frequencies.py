"""Inverse frequencies of rotary embeddings for each scaling type, as transformers' rope-init rules compute them.

Every rule starts from the default RoPE frequencies ``theta ** (-2i / rotary_dim)`` in float32 and returns them
with the factor that multiplies cos and sin. Nothing is cached: each call computes from its own
`RotaryConfig`, so a model may hold several (Gemma 3's local and global layers) without them mixing.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from halyard.models.rotary.config import RotaryConfig


def inverse_frequencies(
    config: RotaryConfig, head_size: int, *, max_position: int, sequence_length: jax.Array | int | None = None
) -> tuple[jax.Array, float]:
    """The rotation speed of each channel pair and the factor multiplying cos/sin.

    Args:
        config: the rotary configuration.
        head_size: channels per head (``rotary_dim`` of them rotate).
        max_position: the model's ``max_position_embeddings``: where ``dynamic`` starts growing the
            base, the default ``original_max_position``, and (longrope) the numerator of the extension factor.
        sequence_length: the current length (``max position + 1`` over the batch), which ``dynamic`` grows its
            base with and ``longrope`` compares with ``original_max_position`` (long factors when above it);
            may be traced. None: ``max_position`` for dynamic, the short factors for longrope.

    Returns:
        ``(inv_freq[rotary_dim // 2] float32, attention_factor)``.

    Raises:
        ValueError: the rotary dimension is odd or below 2, or a longrope factor list has the wrong length.
    """
    config.check_head_size(head_size, "rotary")
    dim = config.rotary_dim(head_size)
    # jnp's float32 power matches torch's bit for bit; numpy's differs in the last place.
    exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
    base_inv_freq = 1.0 / (jnp.float32(config.theta) ** exponents)
    original = config.original_max_position or max_position
    if config.scaling == "default":
        return base_inv_freq, 1.0
    if config.scaling == "linear":
        return base_inv_freq / jnp.float32(config.factor), 1.0
    if config.scaling == "dynamic":
        length = jnp.maximum(
            jnp.asarray(max_position if sequence_length is None else sequence_length), max_position
        )
        growth = config.factor * length.astype(jnp.float32) / max_position - (config.factor - 1)
        base = config.theta * growth ** (dim / (dim - 2))
        return 1.0 / (base**exponents), 1.0
    if config.scaling == "llama3":
        return _llama3(base_inv_freq, config, original), 1.0
    if config.scaling == "longrope":
        return _longrope(config, exponents, original, max_position, sequence_length)
    return _yarn(config, dim, exponents, original)


def _llama3(inv_freq: jax.Array, config: RotaryConfig, original: int) -> jax.Array:
    low_freq_wavelength = original / config.low_freq_factor
    high_freq_wavelength = original / config.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated by `factor`, short ones kept, the band between blended smoothly.
    scaled = jnp.where(wavelength > low_freq_wavelength, inv_freq / config.factor, inv_freq)
    smooth = (original / wavelength - config.low_freq_factor) / (
        config.high_freq_factor - config.low_freq_factor
    )
    blended = (1 - smooth) * scaled / config.factor + smooth * scaled
    in_band = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return jnp.where(in_band, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(config: RotaryConfig, dim: int, exponents: jax.Array, original: int) -> tuple[jax.Array, float]:
    factor = config.factor
    attention_factor = config.attention_factor
    if attention_factor is None:
        if config.mscale and config.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, config.mscale) / _yarn_mscale(
                factor, config.mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        # The channel whose wavelength completes `rotations` turns over the original context.
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(config.theta))

    low, high = correction_dim(config.beta_fast), correction_dim(config.beta_slow)
    if config.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    position_frequencies = jnp.float32(config.theta) ** exponents
    extrapolation = 1.0 / position_frequencies
    interpolation = 1.0 / (jnp.float32(factor) * position_frequencies)
    keep_fraction = 1 - ramp
    inv_freq = interpolation * (1 - keep_fraction) + extrapolation * keep_fraction
    return inv_freq, float(attention_factor)


def longrope_attention_factor(config: RotaryConfig, *, max_position: int) -> float:
    """LongRoPE's cos/sin multiplier: ``attention_factor``, else ``sqrt(1 + log(s) / log(original))``.

    Args:
        config: a ``longrope`` configuration.
        max_position: the model's ``max_position_embeddings``.

    ``s`` is ``config.factor`` when set (not 1.0), else ``max_position / original_max_position`` (Phi-3's
    rule); the multiplier is 1.0 when ``s <= 1``, as in transformers' ``_compute_longrope_parameters``.
    """
    if config.attention_factor is not None:
        return float(config.attention_factor)
    original = config.original_max_position or max_position
    factor = config.factor if config.factor != 1.0 else max_position / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _longrope(
    config: RotaryConfig,
    exponents: jax.Array,
    original: int,
    max_position: int,
    sequence_length: jax.Array | int | None,
) -> tuple[jax.Array, float]:
    assert config.short_factor is not None and config.long_factor is not None  # RotaryConfig checks
    position_frequencies = jnp.float32(config.theta) ** exponents
    short = 1.0 / (jnp.asarray(config.short_factor, jnp.float32) * position_frequencies)
    long = 1.0 / (jnp.asarray(config.long_factor, jnp.float32) * position_frequencies)
    attention_factor = longrope_attention_factor(config, max_position=max_position)
    if sequence_length is None:
        return short, attention_factor
    # One set for the whole batch, chosen by its longest sequence (transformers' dynamic_rope_update).
    return jnp.where(jnp.asarray(sequence_length) > original, long, short), attention_factor
