"""Pieces a family's writer (``families/<name>/hf.py``) builds its ``config.json`` keys from.

A writer returns the architecture's keys for a Halyard config (the engine adds ``architectures``,
``model_type``, the special ids and the dtype) and refuses, with `refusal`, any option the architecture
cannot express: a dropped option would load into a model that computes something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from halyard.models.hf.errors import UnsupportedModelError
from halyard.models.hf.readers import FULL, HF_ACTIVATION_NAMES, SLIDING
from halyard.models.rotary import RotaryConfig


def refusal(config: Any, architecture: str, what: str, fix: str) -> UnsupportedModelError:
    """The error for an option ``what`` of ``config`` that ``architecture`` cannot express; ``fix`` says
    what to use instead (e.g. ``"use the mistral family"``)."""
    return UnsupportedModelError(
        f"{type(config).__name__} has {what}, which Hugging Face's {architecture} cannot express; {fix}"
    )


def activation_to_hf(name: str) -> str:
    """transformers' ACT2FN name of a Halyard activation (``relu_squared`` -> ``relu2``)."""
    return HF_ACTIVATION_NAMES.get(name, name)


def rope_keys(rope: RotaryConfig, architecture: str, config: Any, *, partial: bool = False) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` (None for plain RoPE), the spelling every transformers release
    since 4.45 reads; with ``partial`` also ``partial_rotary_factor``.

    Raises:
        UnsupportedModelError: a partial rotary factor when the architecture rotates the whole head.
    """
    theta, scaling = rope.to_hf()
    keys: dict[str, Any] = {"rope_theta": theta, "rope_scaling": scaling}
    if partial:
        keys["partial_rotary_factor"] = rope.partial_rotary_factor
    elif rope.partial_rotary_factor != 1.0:
        raise refusal(
            config, architecture, f"rope.partial_rotary_factor={rope.partial_rotary_factor}", "use 1.0"
        )
    return keys


def layer_types(windows: Sequence[int | None]) -> list[str]:
    """transformers' ``layer_types`` of per-layer windows (None: full attention)."""
    return [FULL if window is None else SLIDING for window in windows]
