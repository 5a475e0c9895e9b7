"""Walking a config dataclass tree: which keys exist where, so mistakes are named with a suggestion."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from draccus.choice_types import CHOICE_TYPE_KEY, ChoiceType

from halyard.train.config.errors import ConfigError, did_you_mean


def dataclass_in(annotation: Any) -> type | None:
    """The dataclass a field holds (also through `Optional[...]`), or None for any other annotation."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return dataclass_in(members[0])
    return None


def sequence_element_dataclass(annotation: Any) -> type | None:
    """The dataclass held by a `list[X]` / `tuple[X, ...]` field (also through Optional), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return sequence_element_dataclass(members[0]) if len(members) == 1 else None
    if typing.get_origin(annotation) in (list, tuple):
        arguments = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        if len(arguments) == 1:
            return dataclass_in(arguments[0])
    return None


def is_choice_section(cls: type) -> bool:
    """True when `cls` is a draccus choice base whose concrete class is picked by a `type:` key."""
    if not issubclass(cls, ChoiceType):
        return False
    try:
        typing.cast(Any, cls).get_choice_name(
            cls
        )  # a registered concrete class is decoded as itself, without `type:`
    except ValueError:
        return True
    return False


def choice_name_of(base: Any, instance: Any) -> str:
    """The registered `type:` name of `instance` within the choice base `base`."""
    return base.get_choice_name(type(instance))


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (string annotations evaluated)."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls) if field.init}


def resolve_choice(base: Any, layer: dict[str, Any], merged: dict[str, Any], key: str, source: str) -> type:
    """The concrete class a choice section selects, from this layer's `type:` or the one merged so far.

    Raises:
        ConfigError: the `type:` names no registered choice, or no layer has given one.
    """
    known = base.get_known_choices()
    name = layer.get(CHOICE_TYPE_KEY, merged.get(CHOICE_TYPE_KEY))
    if name is None:
        name = base.default_choice_name()
    if name is None:
        raise ConfigError(
            f"config section '{key}' needs a '{CHOICE_TYPE_KEY}:' key in {source}; "
            f"choose one of: {', '.join(sorted(known))}."
        )
    if name not in known:
        raise ConfigError(
            f"unknown {CHOICE_TYPE_KEY} '{name}' for config section '{key}' in {source}; "
            f"choose one of: {', '.join(sorted(known))}.{did_you_mean(str(name), known)}"
        )
    return base.get_choice_class(name)


def check_keys(
    cls: type,
    layer: dict[str, Any],
    merged: dict[str, Any],
    source: str,
    prefix: str = "",
    locations: Mapping[str, str] | None = None,
) -> None:
    """Check that every key of a config layer names a field of the dataclass tree rooted at `cls`.

    Args:
        cls: the dataclass (or choice base) the layer describes.
        layer: the nested dict of one layer (a file or the command-line overrides).
        merged: the dict of the layers below this one, used to know which choice a section selected.
        source: where the layer came from, for the message (a file path or "the command line").
        prefix: the dotted path of `cls` within the root config ("" for the root).
        locations: dotted key -> "file:line" where the layer wrote it, used instead of `source` if known.

    A dataclass lists the keys it no longer has in a class attribute ``REMOVED_KEYS`` (name -> what to
    set instead); such a key gets that advice instead of "unknown key".

    Raises:
        ConfigError: an unknown or removed key (with the closest valid key suggested, or the replacement)
            or an unknown `type:`.
    """
    locations = locations or {}
    section = prefix.rstrip(".") or "<root>"
    if is_choice_section(cls):
        cls = resolve_choice(cls, layer, merged, section, locations.get(f"{prefix}{CHOICE_TYPE_KEY}", source))
        layer = {key: value for key, value in layer.items() if key != CHOICE_TYPE_KEY}
    fields = field_types(cls)
    removed: Mapping[str, str] = getattr(cls, "REMOVED_KEYS", {})
    for key, value in layer.items():
        if key in removed and key not in fields:
            dotted = _first_leaf_key(f"{prefix}{key}", value)
            where = locations.get(dotted) or locations.get(f"{prefix}{key}", source)
            raise ConfigError(f"config key '{dotted}' in {where} was removed: {removed[key]}.")
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{prefix}{key}' in {locations.get(f'{prefix}{key}', source)} "
                f"({cls.__name__} has no field '{key}')."
                f"{did_you_mean(f'{prefix}{key}', [prefix + name for name in fields])}"
            )
        child = dataclass_in(fields[key])
        if child is not None and isinstance(value, dict):
            below = merged.get(key)
            check_keys(
                child, value, below if isinstance(below, dict) else {}, source, f"{prefix}{key}.", locations
            )
        element = sequence_element_dataclass(fields[key])
        if element is not None and isinstance(value, list | tuple):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    check_keys(element, item, {}, source, f"{prefix}{key}.{index}.", locations)


def _first_leaf_key(dotted: str, value: Any) -> str:
    """``trainer.precision`` holding ``{compute: ...}`` -> ``trainer.precision.compute``: the key a user wrote."""
    while isinstance(value, dict) and value:
        name, value = next(iter(value.items()))
        dotted = f"{dotted}.{name}"
    return dotted


def describe_field(cls: type, path: typing.Sequence[str], config: dict[str, Any]) -> str:
    """The annotation of the field at a dotted `path`, as text for an error message ("" if not found).

    Args:
        cls: the root config dataclass.
        path: field names from the root.
        config: the merged nested dict, used to follow `type:` choices.
    """
    annotation: Any = cls
    node: Any = config
    for name in path:
        owner: Any = dataclass_in(annotation)
        if owner is None:
            return ""
        if is_choice_section(owner):
            choice = node.get(CHOICE_TYPE_KEY) if isinstance(node, dict) else None
            if choice not in owner.get_known_choices():
                return ""
            owner = owner.get_choice_class(choice)
        fields = field_types(owner)
        if name not in fields:
            return ""
        annotation = fields[name]
        node = node.get(name) if isinstance(node, dict) else None
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
