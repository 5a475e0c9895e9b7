"""Pieces a family's reader (``families/<name>/hf.py``) builds its Halyard config fields from.

Every helper takes the ``config.json`` mapping (transformers' defaults already filled in) and the ``used``
set, to which it adds the keys it read (the engine checks them against the family's `KeyRule`)::

    def read(hf, used):
        fields = renamed(hf, used, {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers"})
        fields["rope"] = rope(hf, used)
        windows = layer_windows(hf, used, window=hf.get("sliding_window"), num_layers=fields["num_layers"])
        return fields
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from halyard.models.hf.errors import UnsupportedModelError
from halyard.models.rotary import RotaryConfig

FULL, SLIDING = "full_attention", "sliding_attention"
"""transformers' ``layer_types`` entries for global and sliding-window attention layers."""

# transformers' ACT2FN names of Halyard activations they spell differently (see `activation_from_hf`).
HF_ACTIVATION_NAMES = {"relu_squared": "relu2", "squared_relu": "relu2"}


def renamed(hf: Mapping[str, Any], used: set[str], names: Mapping[str, str]) -> dict[str, Any]:
    """``{halyard field: hf[key]}`` for each ``key -> field`` of ``names`` that ``hf`` holds."""
    used.update(names)
    return {field: hf[key] for key, field in names.items() if key in hf}


def activation_from_hf(name: str) -> str:
    """The Halyard name of a transformers activation (``relu2`` -> ``relu_squared``; others unchanged)."""
    return "relu_squared" if name == "relu2" else name


def rope(
    hf: Mapping[str, Any], used: set[str], *, partial: bool = False, original_max_position: bool = False
) -> RotaryConfig:
    """The rotary setting of ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta``.

    Args:
        partial: the architecture rotates only ``partial_rotary_factor`` of each head (Phi-3, ...); when
            False a factor other than 1 is refused.
        original_max_position: also read a top-level ``original_max_position_embeddings`` (Phi-3).

    Raises:
        UnsupportedModelError: a partial factor the architecture does not apply, or (ValueError from
            `RotaryConfig.from_hf`) a rope type or key Halyard does not implement.
    """
    used.update({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"})
    parameters = hf.get("rope_parameters") or hf.get("rope_scaling")
    theta = hf.get("rope_theta", (parameters or {}).get("rope_theta", 10000.0))
    factor = hf.get("partial_rotary_factor", 1.0)
    original = None
    if original_max_position:
        used.add("original_max_position_embeddings")
        original = hf.get("original_max_position_embeddings")
    result = RotaryConfig.from_hf(theta, dict(parameters) if parameters else None, factor, original)
    if not partial and result.partial_rotary_factor != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor={result.partial_rotary_factor}: this Hugging Face architecture rotates "
            "the whole head, so a partial rotary factor is not a checkpoint it can hold"
        )
    return result


def head_dim(hf: Mapping[str, Any], used: set[str], *, heads_key: str = "num_attention_heads") -> int | None:
    """``head_dim``, or None when it is absent or equals ``hidden_size // heads`` (newer transformers
    versions write the default out; None keeps their configs equal to older ones)."""
    used.add("head_dim")
    value = hf.get("head_dim")
    return None if value is None or value == hf["hidden_size"] // hf[heads_key] else int(value)


def layer_windows(
    hf: Mapping[str, Any],
    used: set[str],
    *,
    window: int | None,
    num_layers: int,
    layer_types: Sequence[str] | None = None,
) -> tuple[int | None, ...]:
    """Each layer's attention window (None: every earlier position), by transformers' rule: the layer's
    ``layer_types`` entry when the config has that list, else ``window`` on every layer.

    Args:
        window: the ``sliding_window`` the architecture applies (None when it has none, or when a switch
            like Qwen2's ``use_sliding_window`` turns it off).
        num_layers: the layer count ``layer_types`` must match.
        layer_types: the list to use instead of ``hf["layer_types"]`` (a family that derives it from
            other keys, as transformers' Qwen2 does from ``max_window_layers``).

    Raises:
        UnsupportedModelError: a ``layer_types`` of another length, an entry other than ``full_attention``
            and ``sliding_attention``, or sliding layers without a window.
    """
    used.add("layer_types")
    types = layer_types if layer_types is not None else hf.get("layer_types")
    if types is None:
        return (window,) * num_layers
    types = list(types)
    if len(types) != num_layers:
        raise UnsupportedModelError(f"layer_types lists {len(types)} layers but the model has {num_layers}")
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise UnsupportedModelError(
            f"layer_types entries {unknown} are not supported; Halyard implements {FULL!r} and {SLIDING!r}"
        )
    if SLIDING in types and window is None:
        raise UnsupportedModelError(f"layer_types has {SLIDING!r} layers but no sliding_window is set")
    return tuple(window if kind == SLIDING else None for kind in types)


def full_then_windowed(windows: Sequence[int | None], *, what: str) -> tuple[int | None, int]:
    """``(sliding_window, full_attention_layers)`` of per-layer windows that are some full-attention layers
    followed by layers of one window (the form `LlamaConfig` holds); ``(None, 0)`` when no layer has one.

    Args:
        what: the architecture, for the message.

    Raises:
        UnsupportedModelError: a window before a full-attention layer, or two different windows.
    """
    full = next((index for index, window in enumerate(windows) if window is not None), len(windows))
    if full == len(windows):
        return None, 0
    rest = set(windows[full:])
    if len(rest) != 1:
        kinds = [FULL if window is None else SLIDING for window in windows]
        raise UnsupportedModelError(
            f"layer_types {kinds} (windows {list(windows)}) for {what}: Halyard supports full_attention "
            "layers followed by sliding_attention layers of one window"
        )
    return rest.pop(), full
