"""Rotary position embeddings (RoPE) with the scaling variants Hugging Face checkpoints use.

Numerics follow transformers' Llama rotary embedding: inverse frequencies from the rope-init rule of
the scaling type, ``cos``/``sin`` of ``position * inv_freq`` in float32 (times the attention factor for
yarn), cast to the input's dtype, and the "rotate half" pairing (channel ``i`` pairs with channel
``i + rotary_dim / 2``). With ``partial_rotary_factor < 1`` only the first ``rotary_dim`` channels rotate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.named import Axis, NamedArray

SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn")

# Hugging Face rope_scaling keys -> RotaryConfig fields, per scaling type.
_HF_KEYS: dict[str, dict[str, str]] = {
    "default": {},
    "linear": {"factor": "factor"},
    "dynamic": {"factor": "factor"},
    "llama3": {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_position",
        "low_freq_factor": "low_freq_factor",
        "high_freq_factor": "high_freq_factor",
    },
    "yarn": {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_position",
        "beta_fast": "beta_fast",
        "beta_slow": "beta_slow",
        "mscale": "mscale",
        "mscale_all_dim": "mscale_all_dim",
        "attention_factor": "attention_factor",
        "truncate": "truncate",
    },
}
_HF_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclass(frozen=True)
class RotaryConfig:
    """How rotary embeddings turn positions into rotations.

    Args:
        theta: the base wavelength (Hugging Face ``rope_theta``).
        scaling: ``default`` | ``linear`` (positions divided by ``factor``) | ``dynamic`` (NTK base
            growth past ``max_position``) | ``llama3`` (per-band frequency scaling) | ``yarn``.
        factor: the context-extension factor of the scaling types.
        original_max_position: the pre-training context length (llama3, yarn); defaults to the
            ``max_position`` given to `apply_rotary`.
        low_freq_factor, high_freq_factor: llama3's band edges.
        beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate: yarn's parameters
            (``attention_factor`` multiplies cos and sin; derived from ``factor`` and the mscales when None).
        partial_rotary_factor: the fraction of ``head_size`` that rotates (the first channels).

    Raises:
        ValueError: unknown ``scaling``, or a non-positive factor / theta, or a fraction outside (0, 1].
    """

    theta: float = 10000.0
    scaling: str = "default"
    factor: float = 1.0
    original_max_position: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    partial_rotary_factor: float = 1.0
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(f"RotaryConfig.scaling {self.scaling!r} is unknown; choose one of {SCALINGS}")
        if not self.theta > 0:
            raise ValueError(f"RotaryConfig.theta must be positive, got {self.theta}")
        if not self.factor > 0:
            raise ValueError(f"RotaryConfig.factor must be positive, got {self.factor}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(
                f"RotaryConfig.partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
            )
        if self.scaling == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"RotaryConfig: llama3 needs high_freq_factor ({self.high_freq_factor}) > "
                f"low_freq_factor ({self.low_freq_factor})"
            )

    @classmethod
    def from_hf(
        cls, rope_theta: float, rope_scaling: dict | None, partial_rotary_factor: float = 1.0
    ) -> RotaryConfig:
        """Read a Hugging Face config's ``rope_theta`` and ``rope_scaling`` / ``rope_parameters`` dict.

        Args:
            rope_theta: ``config.rope_theta`` (a ``rope_theta`` inside the dict takes precedence).
            rope_scaling: the dict (``rope_type`` or legacy ``type`` plus the type's keys), or None.
            partial_rotary_factor: ``config.partial_rotary_factor`` (also read from the dict).

        Raises:
            ValueError: an unsupported rope type or a key that type does not use (named in the message).
        """
        if not rope_scaling:
            return cls(theta=float(rope_theta), partial_rotary_factor=float(partial_rotary_factor))
        scaling = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if scaling not in _HF_KEYS:
            raise ValueError(
                f"rope_scaling type {scaling!r} is not supported; Halyard reads {tuple(_HF_KEYS)}"
            )
        known = _HF_KEYS[scaling]
        unknown = sorted(key for key in rope_scaling if key not in known and key not in _HF_COMMON_KEYS)
        if unknown:
            raise ValueError(
                f"rope_scaling of type {scaling!r} has unknown key(s) {unknown}; this type uses "
                f"{sorted(known) + ['rope_type', 'rope_theta', 'partial_rotary_factor']}"
            )
        values: dict[str, Any] = {"scaling": scaling}
        for hf_key, field_name in known.items():
            if rope_scaling.get(hf_key) is not None:
                values[field_name] = rope_scaling[hf_key]
        values["theta"] = float(rope_scaling.get("rope_theta", rope_theta))
        values["partial_rotary_factor"] = float(
            rope_scaling.get("partial_rotary_factor", partial_rotary_factor)
        )
        return cls(**values)

    def to_hf(self) -> tuple[float, dict | None]:
        """``(rope_theta, rope_scaling)`` as a Hugging Face config stores them (None for default RoPE).

        ``partial_rotary_factor`` is a separate config attribute in Hugging Face and is not included.
        """
        if self.scaling == "default":
            return self.theta, None
        result: dict[str, Any] = {"rope_type": self.scaling}
        for hf_key, field_name in _HF_KEYS[self.scaling].items():
            value = getattr(self, field_name)
            if value is not None:
                result[hf_key] = value
        return self.theta, result

    def rotary_dim(self, head_size: int) -> int:
        """How many leading channels of a head rotate."""
        return int(head_size * self.partial_rotary_factor)

    def check_head_size(self, head_size: int, where: str) -> None:
        """Refuse a head size whose rotating channels do not form pairs (checked by model configs).

        Args:
            head_size: channels per head.
            where: how the head size came about, for the message (``"LlamaConfig: hidden_size 32 / ..."``).

        Raises:
            ValueError: ``rotary_dim(head_size)`` is odd or below 2.
        """
        dim = self.rotary_dim(head_size)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"{where} gives head_size {head_size}, so rotary_dim {dim} (head_size x partial_rotary_factor "
                f"{self.partial_rotary_factor}); rotary embeddings rotate channel pairs and need an even "
                "rotary_dim >= 2: use fewer heads, a wider model, or an even head_dim"
            )


def inverse_frequencies(
    config: RotaryConfig, head_size: int, *, max_position: int, sequence_length: jax.Array | int | None = None
) -> tuple[jax.Array, float]:
    """The rotation speed of each channel pair and the factor multiplying cos/sin.

    Args:
        config: the rotary configuration.
        head_size: channels per head (``rotary_dim`` of them rotate).
        max_position: the model's ``max_position_embeddings``: where ``dynamic`` starts growing the
            base, and the default ``original_max_position``.
        sequence_length: for ``dynamic``, the current length (``max position + 1``); may be traced.

    Returns:
        ``(inv_freq[rotary_dim // 2] float32, attention_factor)``.
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


def apply_rotary(
    x: NamedArray, positions: NamedArray, config: RotaryConfig, *, max_position: int
) -> NamedArray:
    """Rotate queries or keys by their positions.

    Args:
        x: ``(batch..., "pos", heads-like..., "head_size")`` (any order; the axis may also be
            ``key_pos`` when ``positions`` uses that name).
        positions: integer absolute positions ``(batch..., "pos")``; its axes must all be axes of ``x``
            (missing batch axes broadcast).
        config: the rotary configuration.
        max_position: the model's ``max_position_embeddings`` (see `inverse_frequencies`).

    Returns:
        ``x`` rotated, same axes, order and dtype.

    Raises:
        ValueError: ``x`` has no ``head_size`` axis, ``positions`` has an axis ``x`` lacks, or the rotary
            dimension is odd.
    """
    if not x.has_axis("head_size"):
        raise ValueError(f"apply_rotary: x has axes {x.axis_names} but needs a 'head_size' axis")
    missing = [name for name in positions.axis_names if not x.has_axis(name)]
    if missing:
        raise ValueError(f"apply_rotary: positions has axes {missing} that x {x.axis_names} lacks")
    head_size = x.axis_size("head_size")
    sequence_length = jnp.max(positions.array) + 1 if config.scaling == "dynamic" else None
    inv_freq, attention_factor = inverse_frequencies(
        config, head_size, max_position=max_position, sequence_length=sequence_length
    )
    dim = 2 * inv_freq.shape[0]
    angles = positions.array.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    RotaryChannels = Axis("head_size", dim)
    cos = NamedArray((jnp.cos(angles) * attention_factor).astype(x.dtype), (*positions.axes, RotaryChannels))
    sin = NamedArray((jnp.sin(angles) * attention_factor).astype(x.dtype), (*positions.axes, RotaryChannels))
    ordered = x.rearrange(..., "head_size")
    rotary_axes = (*ordered.axes[:-1], RotaryChannels)
    cos_array = hn.broadcast_to(cos, rotary_axes).array
    sin_array = hn.broadcast_to(sin, rotary_axes).array
    rotating, passing = ordered.array[..., :dim], ordered.array[..., dim:]
    first, second = rotating[..., : dim // 2], rotating[..., dim // 2 :]
    rotated_half = jnp.concatenate([-second, first], axis=-1)
    rotated = rotating * cos_array + rotated_half * sin_array
    result = jnp.concatenate([rotated, passing], axis=-1) if passing.shape[-1] else rotated
    return NamedArray(result, ordered.axes).rearrange(*x.axis_names)
