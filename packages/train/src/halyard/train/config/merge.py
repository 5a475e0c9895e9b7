"""Merging config layers (defaults, included files, the file, command-line overrides)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import draccus
from draccus.choice_types import CHOICE_TYPE_KEY

from halyard.train.config.schema import dataclass_in, field_types, is_choice_section


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return `base` with `override` merged on top, recursively; neither input is modified.

    Nested mappings merge key by key. A mapping in `override` whose `type:` differs from the one in `base`
    replaces it whole, because the fields of one choice (say `adamw`) mean nothing to another (`lion`).
    (`merge_layer` is the schema-aware merge that keeps the fields both choices have.)

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


@dataclasses.dataclass(frozen=True)
class DroppedKey:
    """A value a layer below had set, dropped because a `type:` switch chose a class without that field."""

    key: str
    """The dotted key, e.g. `optimizer.epsilon`."""
    new_type: str
    """The `type:` that has no such field."""


def merge_layer(
    config_class: type,
    base: dict[str, Any],
    layer: dict[str, Any],
    explicit: Collection[str],
    prefix: str = "",
) -> tuple[dict[str, Any], list[DroppedKey]]:
    """Merge one config layer over `base` key by key, also across a `type:` switch.

    Where `layer` switches a polymorphic section's `type:` (`--optimizer.type lion` over a file's adamw),
    the section starts from the new type's defaults, keeps every value of `base` that a layer set
    explicitly (a dotted key in `explicit`) and that the new type also has, and drops the others (the
    old type's defaults silently; explicit values are returned so the caller can say so).

    Args:
        config_class: the dataclass (or choice base) that `base` and `layer` describe.
        base: the layers merged so far (defaults included); not modified.
        layer: the higher-priority layer; not modified.
        explicit: dotted keys set by a file or the command line so far (defaults are not explicit).
        prefix: the dotted path of `config_class` in the root config.

    Returns:
        The merged dict and the explicit keys dropped at type switches.
    """
    dropped: list[DroppedKey] = []
    cls = _concrete(config_class, layer.get(CHOICE_TYPE_KEY, base.get(CHOICE_TYPE_KEY)))
    fields = field_types(cls) if cls is not None else {}
    merged = dict(base)
    for key, value in layer.items():
        previous = merged.get(key)
        child = dataclass_in(fields[key]) if key in fields else None
        if not (isinstance(value, dict) and isinstance(previous, dict)):
            merged[key] = value
        elif child is None:
            merged[key] = deep_merge(previous, value)
        else:
            path = f"{prefix}{key}."
            if _switches_type(previous, value) and is_choice_section(child):
                new_class = _concrete(child, value[CHOICE_TYPE_KEY])
                if new_class is not None:
                    previous = _carry_over(
                        new_class, previous, explicit, path, value[CHOICE_TYPE_KEY], dropped
                    )
            merged[key], below = merge_layer(child, previous, value, explicit, path)
            dropped.extend(below)
    return merged, dropped


def _carry_over(
    new_class: type,
    old: dict[str, Any],
    explicit: Collection[str],
    prefix: str,
    new_type: str,
    dropped: list[DroppedKey],
) -> dict[str, Any]:
    """The new type's defaults with the explicitly set values of `old` that it also has."""
    fields = field_types(new_class)
    kept: dict[str, Any] = {}
    for key, value in old.items():
        path = f"{prefix}{key}"
        if key == CHOICE_TYPE_KEY or not _is_explicit(path, explicit):
            continue
        if key in fields:
            kept[key] = _explicit_part(value, path, explicit)
        else:
            dropped.append(DroppedKey(path, new_type))
    return deep_merge(_defaults_of(new_class), kept)


def _explicit_part(value: Any, path: str, explicit: Collection[str]) -> Any:
    """The explicitly set part of a kept value (a section keeps only the keys a layer set)."""
    if not isinstance(value, dict):
        return value
    inner = {
        key: _explicit_part(item, f"{path}.{key}", explicit)
        for key, item in value.items()
        if _is_explicit(f"{path}.{key}", explicit)
    }
    return inner if inner or path not in explicit else value


def _is_explicit(path: str, explicit: Collection[str]) -> bool:
    return path in explicit or any(key.startswith(f"{path}.") for key in explicit)


def _concrete(cls: type, type_name: Any) -> type | None:
    """`cls` itself, or for a choice base the class registered as `type_name` (None if unknown)."""
    if not is_choice_section(cls):
        return cls
    registry: Any = cls
    name = type_name if type_name is not None else registry.default_choice_name()
    return registry.get_choice_class(name) if name in registry.get_known_choices() else None


def _defaults_of(cls: type) -> dict[str, Any]:
    try:
        return dict(draccus.encode(cls()))
    except TypeError:  # required fields: the layers must supply them
        return {}


def _switches_type(base: dict[str, Any], override: dict[str, Any]) -> bool:
    return CHOICE_TYPE_KEY in override and override[CHOICE_TYPE_KEY] != base.get(CHOICE_TYPE_KEY)
