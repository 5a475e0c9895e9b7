"""`RotaryConfig`: how rotary embeddings turn positions into rotations, read from and written to the
``rope_theta`` / ``rope_scaling`` of Hugging Face configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

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
    "longrope": {
        "short_factor": "short_factor",
        "long_factor": "long_factor",
        "original_max_position_embeddings": "original_max_position",
        "attention_factor": "attention_factor",
        "factor": "factor",
    },
}
_HF_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
# The types whose original_max_position transformers replaces by a top-level original_max_position_embeddings.
_HF_ORIGINAL_MAX_POSITION_TYPES = ("llama3", "yarn", "longrope")
_LONGROPE_FACTORS = ("short_factor", "long_factor")
_HF_REQUIRED_KEYS = {"longrope": _LONGROPE_FACTORS}


@dataclass(frozen=True)
class RotaryConfig:
    """How rotary embeddings turn positions into rotations.

    Args:
        theta: the base wavelength (Hugging Face ``rope_theta``).
        scaling: ``default`` | ``linear`` (positions divided by ``factor``) | ``dynamic`` (NTK base
            growth past ``max_position``) | ``llama3`` (per-band frequency scaling) | ``yarn`` |
            ``longrope`` (Phi-3: per-frequency divisors, the long set once the batch's longest sequence
            passes ``original_max_position``).
        factor: the context-extension factor of the scaling types. longrope only derives its default
            ``attention_factor`` from it, and 1.0 there means ``max_position / original_max_position``.
        original_max_position: the pre-training context length (llama3, yarn, longrope); defaults to the
            ``max_position`` given to `apply_rotary`.
        low_freq_factor, high_freq_factor: llama3's band edges.
        beta_fast, beta_slow, mscale, mscale_all_dim, truncate: yarn's parameters.
        attention_factor: multiplies cos and sin (yarn, longrope); when None, derived from ``factor`` and the
            mscales (yarn) or ``sqrt(1 + log(factor) / log(original_max_position))`` (longrope, 1.0 for a
            factor <= 1).
        short_factor, long_factor: longrope's divisors of the inverse frequencies, one per rotating channel
            pair (``rotary_dim // 2`` entries; lists become tuples); long ones apply to sequences longer
            than ``original_max_position``.
        partial_rotary_factor: the fraction of ``head_size`` that rotates (the first channels).

    Raises:
        ValueError: unknown ``scaling``, a non-positive factor / theta, a fraction outside (0, 1], or longrope
            factors missing, non-positive, or given to another scaling type.
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
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

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
        for name in _LONGROPE_FACTORS:
            self._check_longrope_factors(name, getattr(self, name))

    def _check_longrope_factors(self, name: str, values: Any) -> None:
        if values is None:
            if self.scaling == "longrope":
                raise ValueError(
                    f"RotaryConfig: longrope needs {name} (one divisor per rotating channel pair)"
                )
            return
        if self.scaling != "longrope":
            raise ValueError(f"RotaryConfig.{name} is longrope's; scaling {self.scaling!r} does not use it")
        numbers = isinstance(values, (list, tuple)) and all(
            isinstance(value, (int, float)) and not isinstance(value, bool) for value in values
        )
        if not numbers or not values or not all(value > 0 for value in values):
            raise ValueError(
                f"RotaryConfig.{name} must be a non-empty list of positive numbers, got {values!r}"
            )
        # A YAML list becomes a tuple: the config is a static (hashed) field of the model.
        object.__setattr__(self, name, tuple(float(value) for value in values))

    @classmethod
    def from_hf(
        cls,
        rope_theta: float,
        rope_scaling: dict | None,
        partial_rotary_factor: float = 1.0,
        original_max_position: int | None = None,
    ) -> RotaryConfig:
        """Read a Hugging Face config's ``rope_theta`` and ``rope_scaling`` / ``rope_parameters`` dict.

        Args:
            rope_theta: ``config.rope_theta`` (a ``rope_theta`` inside the dict takes precedence).
            rope_scaling: the dict (``rope_type`` or legacy ``type`` plus the type's keys), or None.
            partial_rotary_factor: ``config.partial_rotary_factor`` (also read from the dict).
            original_max_position: a top-level ``config.original_max_position_embeddings`` (Phi-3 keeps it
                there); as in transformers it replaces the dict's value for llama3, yarn and longrope.

        Raises:
            ValueError: an unsupported rope type, a key that type does not use, or one it requires and the dict
                lacks (named in the message).
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
        missing = [key for key in _HF_REQUIRED_KEYS.get(scaling, ()) if rope_scaling.get(key) is None]
        if missing:
            raise ValueError(
                f"rope_scaling of type {scaling!r} lacks key(s) {missing}, which this type requires"
            )
        values: dict[str, Any] = {"scaling": scaling}
        for hf_key, field_name in known.items():
            if rope_scaling.get(hf_key) is not None:
                values[field_name] = rope_scaling[hf_key]
        if original_max_position is not None and scaling in _HF_ORIGINAL_MAX_POSITION_TYPES:
            values["original_max_position"] = int(original_max_position)
        if scaling == "longrope" and values.get("factor") == 1.0 and "attention_factor" not in values:
            # RotaryConfig's longrope factor 1.0 means "max_position / original"; an explicit 1.0 means no scaling.
            values["attention_factor"] = 1.0
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
            if self.scaling == "longrope" and field_name == "factor" and value == 1.0:
                continue  # transformers would read an explicit 1.0 as "no extension" (attention factor 1)
            if value is not None:
                result[hf_key] = list(value) if field_name in _LONGROPE_FACTORS else value
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
            ValueError: ``rotary_dim(head_size)`` is odd or below 2, or a longrope factor list does not have
                ``rotary_dim // 2`` entries.
        """
        dim = self.rotary_dim(head_size)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"{where} gives head_size {head_size}, so rotary_dim {dim} (head_size x partial_rotary_factor "
                f"{self.partial_rotary_factor}); rotary embeddings rotate channel pairs and need an even "
                "rotary_dim >= 2: use fewer heads, a wider model, or an even head_dim"
            )
        for name in _LONGROPE_FACTORS:
            factors = getattr(self, name)
            if factors is not None and len(factors) != dim // 2:
                raise ValueError(
                    f"rope {name} has {len(factors)} entries but {where} gives rotary_dim {dim} (head_size "
                    f"{head_size} x partial_rotary_factor {self.partial_rotary_factor}): it needs {dim // 2}"
                )
