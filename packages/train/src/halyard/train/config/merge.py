"""Merging config layers (defaults, included files, the file, command-line overrides)."""

from __future__ import annotations

from typing import Any

from draccus.choice_types import CHOICE_TYPE_KEY


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return `base` with `override` merged on top, recursively; neither input is modified.

    Nested mappings merge key by key. A mapping in `override` whose `type:` differs from the one in `base`
    replaces it whole, because the fields of one choice (say `adamw`) mean nothing to another (`lion`).

    Args:
        base: the lower-priority layer.
        override: the higher-priority layer.
    """
    merged = dict(base)
    for key, value in override.items():
        previous = merged.get(key)
        if isinstance(value, dict) and isinstance(previous, dict) and not _switches_type(previous, value):
            merged[key] = deep_merge(previous, value)
        else:
            merged[key] = value
    return merged


def _switches_type(base: dict[str, Any], override: dict[str, Any]) -> bool:
    return CHOICE_TYPE_KEY in override and override[CHOICE_TYPE_KEY] != base.get(CHOICE_TYPE_KEY)
