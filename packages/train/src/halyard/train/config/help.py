"""``--help`` that explains: every key with its type, default and meaning, grouped by section.

A polymorphic section (``type:``) lists its shared keys once, then each type's own keys once; a type that
extends another (``mistral`` extends ``llama``) lists only the defaults it changes. A nested section
(``model.rope``) has one group, and a type whose defaults differ there lists only those.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

import yaml
from draccus.choice_types import CHOICE_TYPE_KEY

from halyard.train.config.meanings import class_summary, field_meaning
from halyard.train.config.schema import (
    dataclass_in,
    field_types,
    is_choice_section,
    sequence_element_dataclass,
)


@dataclass(frozen=True)
class HelpEntry:
    """One key of the help text."""

    key: str
    """Dotted key (`trainer.mesh.fsdp`; `trackers[].project` for the items of a list)."""
    type: str
    """The value's type as text (`int`, `str | null`, `adamw | lion | ...`)."""
    default: str
    """The default as YAML text."""
    meaning: str
    """What the key does (the field's docstring)."""


@dataclass
class HelpGroup:
    """A titled run of keys: a section, the shared keys of a polymorphic section, or one of its types."""

    title: str
    entries: list[HelpEntry] = field(default_factory=list)


def help_groups(root: type) -> list[HelpGroup]:
    """Every key of the config tree rooted at ``root``, grouped for the help text, in field order.

    Args:
        root: the root config dataclass (its default instance gives the defaults).
    """
    collector = _Collector()
    instance = root()
    general = HelpGroup(f"{root.__name__}: {_first_sentence(class_summary(root))}")
    for name, annotation in field_types(root).items():
        value = getattr(instance, name)
        meaning = field_meaning(root, name)
        section = dataclass_in(annotation)
        element = sequence_element_dataclass(annotation)
        if section is not None and is_choice_section(section):
            collector.choice(section, value, f"{name}.", meaning)
        elif section is not None:
            group = collector.group(f"{name}: {meaning or class_summary(section)}")
            collector.fields(group, type(value), value, f"{name}.")
        elif element is not None and is_choice_section(element):
            encoded = _yaml(_encode(value, annotation))
            collector.group(f"{name}: {meaning}").entries.append(HelpEntry(name, "list", encoded, meaning))
            collector.choice(element, None, f"{name}[].", f"each item of {name}")
        else:
            general.entries.append(HelpEntry(name, _type_text(annotation), _yaml(value), meaning))
    return ([general] if general.entries else []) + collector.groups


def config_help(root: type, prog: str | None = None) -> str:
    """The ``--help`` text of the config tree rooted at ``root``."""
    lines = [
        f"usage: {prog or 'train'} --config CONFIG [--config MORE.yaml] [--KEY VALUE ...]",
        "",
        "CONFIG is a YAML file or a built-in config (`halyard configs`); later files and --KEY VALUE",
        "overrides win. Values are YAML: `--trainer.steps 200`, `--data.sources '[a.jsonl, b.jsonl]'`,",
        "`--model.sliding_window null`. A section's `type:` picks its variant; switching type keeps the",
        "values the new type has keys for. `halyard config show CONFIG` prints a config with every meaning.",
    ]
    groups = help_groups(root)
    entries = [entry for group in groups for entry in group.entries]
    left_width = min(max(len(_left(entry)) for entry in entries) + 2, 52)
    printed: dict[str, str] = {}  # a line already shown -> the group that showed it
    for group in groups:
        lines += ["", group.title]
        label = ":".join(group.title.split(":")[:2])
        previous: HelpEntry | None = None
        for entry in group.entries:
            left = _left(entry)
            meaning = _first_sentence(entry.meaning).replace("``", "`")
            if previous is not None and entry.meaning == previous.meaning:
                meaning = f"as --{previous.key}"
            else:
                previous = entry
            # One line per key (a long meaning runs on and the terminal wraps it): every line names its key.
            line = f"{left}  {meaning}" if len(left) + 2 > left_width else left.ljust(left_width) + meaning
            if line in printed:  # the same key, default and meaning in a sibling type
                line = f"{left.ljust(left_width)}as in {printed[line]}"
            else:
                printed[line] = label
            lines.append(line)
    return "\n".join(line.rstrip() for line in lines)


class _Collector:
    """Builds the groups; a nested section (``model.rope``) gets one group, shared by every type using it."""

    def __init__(self) -> None:
        self.groups: list[HelpGroup] = []
        self.nested: dict[str, dict[str, str]] = {}

    def group(self, title: str) -> HelpGroup:
        group = HelpGroup(title)
        self.groups.append(group)
        return group

    def choice(self, base: Any, value: Any, prefix: str, meaning: str) -> None:
        """A polymorphic section: its `type:` and shared keys, then each type's own keys."""
        variants: dict[str, type] = dict(base.get_known_choices())
        default_name = base.get_choice_name(type(value)) if value is not None else base.default_choice_name()
        section = prefix.rstrip(".")
        shared = self.group(f"{section}: {meaning}")
        shared.entries.append(
            HelpEntry(
                f"{prefix}{CHOICE_TYPE_KEY}",
                " | ".join(sorted(variants)),
                default_name or "(required)",
                f"Which {section} variant; each type's keys are listed below.",
            )
        )
        common = _common_ancestor(list(variants.values()))
        common_names = {f.name for f in dataclasses.fields(common)} if common else set()
        if common is not None and common_names:
            defaults = value if value is not None else _default_instance(variants.get(default_name or ""))
            before = len(shared.entries)
            self.fields(shared, common, defaults, prefix, only=common_names)
            shared.entries[before:] = [
                _with_other_defaults(entry, prefix, variants, default_name)
                for entry in shared.entries[before:]
            ]
        for name in sorted(variants, key=lambda n: (n != default_name, n)):
            cls = variants[name]
            instance = _shown_instance(value, cls)
            group = self.group(f"{section}, type: {name}: {_variant_summary(cls, instance)}")
            self.fields(group, cls, instance, prefix, skip=common_names)
            parent = _parent_variant(name, variants, common)
            if parent is not None:  # its defaults against those shown for the parent
                scratch = _Collector()
                inherited = HelpGroup("")
                scratch.fields(
                    inherited,
                    variants[parent],
                    _shown_instance(value, variants[parent]),
                    prefix,
                    skip=common_names,
                )
                parent_defaults = {e.key: e.default for e in inherited.entries}
                for defaults in scratch.nested.values():
                    parent_defaults.update(defaults)
                changed = [e for e in group.entries if parent_defaults.get(e.key, e.default) != e.default]
                group.entries = [e for e in group.entries if e.key not in parent_defaults]
                shown = ", ".join(f"{e.key.removeprefix(prefix)}={e.default}" for e in changed)
                group.title += f" Every {parent} key" + (f"; defaults here: {shown}." if shown else ".")
                group.title += " And:" if group.entries else ""

    def fields(
        self,
        group: HelpGroup,
        cls: type,
        instance: Any,
        prefix: str,
        *,
        only: Set[str] | None = None,
        skip: Set[str] = frozenset(),
    ) -> None:
        """Append the keys of dataclass ``cls`` to ``group`` (a nested section to its own group)."""
        for name, annotation in field_types(cls).items():
            if (only is not None and name not in only) or name in skip:
                continue
            value = getattr(instance, name) if instance is not None else None
            meaning = field_meaning(cls, name)
            section = dataclass_in(annotation)
            if section is not None and is_choice_section(section):
                self.choice(section, value, f"{prefix}{name}.", meaning)
            elif section is not None:
                value = value if value is not None else _default_instance(section)
                self._nested_section(group, section, value, f"{prefix}{name}.", meaning)
            else:
                group.entries.append(
                    HelpEntry(f"{prefix}{name}", _type_text(annotation), _yaml(value), meaning)
                )

    def _nested_section(self, group: HelpGroup, cls: type, value: Any, prefix: str, meaning: str) -> None:
        """The first user of ``prefix`` gets a group for it; a later one lists only the defaults it changes."""
        entries = HelpGroup("")
        self.fields(entries, cls, value, prefix)
        if prefix not in self.nested:
            self.nested[prefix] = {e.key: e.default for e in entries.entries}
            self.group(f"{prefix.rstrip('.')}: {meaning or class_summary(cls)}").entries = entries.entries
            return
        defaults = self.nested[prefix]
        group.entries += [e for e in entries.entries if defaults.get(e.key) != e.default]


def _left(entry: HelpEntry) -> str:
    return f"  --{entry.key} {entry.type} = {entry.default}"


def _first_sentence(text: str) -> str:
    """Up to the first full stop ending a sentence (`halyard config show` prints the rest)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", text, maxsplit=1)[0]


def _with_other_defaults(
    entry: HelpEntry, prefix: str, variants: dict[str, type], default: str | None
) -> HelpEntry:
    """A shared key whose default differs for some types says so: `save_dots (mixtral: none)`."""
    name = entry.key.removeprefix(prefix)
    if "." in name:
        return entry
    others = []
    for variant_name, cls in sorted(variants.items()):
        instance = _default_instance(cls)
        if (
            variant_name != default
            and instance is not None
            and _yaml(getattr(instance, name)) != entry.default
        ):
            others.append(f"{variant_name}: {_yaml(getattr(instance, name))}")
    return dataclasses.replace(entry, default=f"{entry.default} ({', '.join(others)})") if others else entry


def _shown_instance(value: Any, cls: type) -> Any:
    """The defaults the help shows for type ``cls``: the config's own section when it is of that type (a run
    config's default model), else the type's class defaults."""
    return value if value is not None and type(value) is cls else _default_instance(cls)


def _variant_summary(cls: type, shown: Any) -> str:
    """A type's one-line summary; when the defaults shown are the config's, not the class's, it says so (and
    moves the class's own, a ``(defaults: ...)`` remark of its summary, aside)."""
    summary = _first_sentence(class_summary(cls))
    own = _default_instance(cls)
    if own is None or shown is None or _encode(shown) == _encode(own):
        return summary
    remark = re.search(r"\s*\(defaults: ([^)]*)\)", summary)
    base = (summary[: remark.start()] + summary[remark.end() :] if remark else summary).rstrip(". ")
    class_defaults = f": {remark[1]}" if remark else " differ"
    return f"{base}; the defaults below are this config's ({cls.__name__}'s own{class_defaults})."


def _common_ancestor(classes: list[type]) -> type | None:
    """The most derived dataclass every class inherits from (its fields are the shared keys)."""
    for klass in classes[0].__mro__:
        if dataclasses.is_dataclass(klass) and all(issubclass(c, klass) for c in classes):
            return klass
    return None


def _parent_variant(name: str, variants: dict[str, type], common: type | None) -> str | None:
    """The registered type that type ``name`` extends: its nearest registered ancestor (mistral: llama)."""
    mro = variants[name].__mro__
    ancestors = [
        (mro.index(other_cls), other)
        for other, other_cls in variants.items()
        if other != name and other_cls is not common and other_cls in mro[1:]
    ]
    return min(ancestors)[1] if ancestors else None


def _default_instance(cls: type | None) -> Any:
    if cls is None:
        return None
    try:
        return cls()
    except TypeError:
        return None


def _encode(value: Any, declared_type: Any = None) -> Any:
    import draccus

    return draccus.encode(value, declared_type=declared_type)


def _yaml(value: Any) -> str:
    if isinstance(value, str) and (not value or value != value.strip() or "\n" in value):
        return json.dumps(value)
    if dataclasses.is_dataclass(value) or isinstance(value, list | tuple):
        value = _encode(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_text(a) for a in typing.get_args(annotation))
    if origin in (list, tuple, dict):
        arguments = ", ".join("..." if a is Ellipsis else _type_text(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{arguments}]"
    return getattr(annotation, "__name__", str(annotation))
