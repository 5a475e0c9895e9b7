"""A resolved config as YAML with each key's meaning as a comment above it (``halyard config show``).

The text parses back to the same config: comments aside, it is the YAML ``save_resolved_config`` writes.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import draccus
import yaml
from draccus.choice_types import CHOICE_TYPE_KEY

from halyard.train.config.meanings import class_summary, field_meaning
from halyard.train.config.schema import (
    dataclass_in,
    field_types,
    is_choice_section,
    sequence_element_dataclass,
)

WIDTH = 100
"""Comment lines are wrapped to this many columns."""


def commented_yaml(config: Any) -> str:
    """The YAML of ``config`` (every field, the `type:` of each choice) with every meaning as comments.

    Args:
        config: a config dataclass instance (`TrainConfig` or any config tree).
    """
    lines: list[str] = []
    _emit(config, draccus.encode(config), 0, lines, choices=None)
    return "\n".join(lines) + "\n"


def _emit(obj: Any, node: dict[str, Any], indent: int, lines: list[str], choices: list[str] | None) -> None:
    pad = " " * indent
    annotations = field_types(type(obj))
    for key, value in node.items():
        if key == CHOICE_TYPE_KEY:
            meaning = f"Which variant of this section: {' | '.join(sorted(choices or []))}."
        else:  # a section without a docstring of its own is described by its class
            meaning = field_meaning(type(obj), key) or class_summary(type(getattr(obj, key)))
        meaning = meaning.replace("``", "`")
        lines += [f"{pad}# {part}" for part in textwrap.wrap(meaning, max(WIDTH - indent - 2, 40))]
        child = getattr(obj, key, None)
        annotation = annotations.get(key)
        section = dataclass_in(annotation) if annotation is not None else None
        element = sequence_element_dataclass(annotation) if annotation is not None else None
        if isinstance(value, dict) and value and section is not None:
            lines.append(f"{pad}{key}:")
            _emit(child, value, indent + 2, lines, _choice_names(section))
        elif isinstance(value, list) and value and element is not None:
            lines.append(f"{pad}{key}:")
            for item, encoded in zip(child or [], value):
                lines.append(f"{pad}  -")
                _emit(item, encoded, indent + 4, lines, _choice_names(element))
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")


def _choice_names(cls: Any) -> list[str] | None:
    return list(cls.get_known_choices()) if is_choice_section(cls) else None


def _scalar(value: Any) -> str:
    if isinstance(value, str) and (not value or value != value.strip() or "\n" in value):
        return json.dumps(value)  # a YAML double-quoted string
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
