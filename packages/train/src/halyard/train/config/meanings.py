"""The meaning of every config key, read from the dataclass that declares it.

A field's meaning is its attribute docstring, the string right below it in the class body (what
draccus, Sphinx and editors read too):

    seq_len: int = 256
    \"\"\"Tokens per training sequence.\"\"\"

Classes of the lower packages (halyard.models, halyard.shard), which document their fields in the
class docstring's ``Attributes:`` or ``Args:`` section, are read from that section. A field redeclared
by a subclass (a new default) keeps the meaning of the class that documents it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap

_SECTION_HEADERS = ("Attributes:", "Args:")


def field_meaning(cls: type, name: str) -> str:
    """The one-paragraph meaning of field ``name`` of dataclass ``cls`` ("" when no class documents it).

    Args:
        cls: the dataclass (or a subclass of the one declaring the field).
        name: the field name.
    """
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        meaning = _attribute_docstrings(klass).get(name) or _docstring_section(klass).get(name)
        if meaning:
            return meaning
    return ""


def class_summary(cls: type) -> str:
    """The first line of a class's own docstring ("" for none, or the one `dataclass` makes up)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return doc.strip().split("\n", 1)[0].strip()


@functools.cache
def _attribute_docstrings(klass: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # classes made at runtime (the model section's twins) have no source
        return {}
    tree = ast.parse(source)
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = _one_paragraph(following.value.value)
    return docs


@functools.cache
def _docstring_section(klass: type) -> dict[str, str]:
    """``name -> text`` of a Google-style ``Attributes:`` / ``Args:`` section of the class's own docstring."""
    doc = klass.__dict__.get("__doc__") or ""
    lines = inspect.cleandoc(doc).splitlines()
    names = {field.name for field in dataclasses.fields(klass)}
    entries: dict[str, str] = {}
    inside, current = False, ""
    for line in lines:
        if line.strip() in _SECTION_HEADERS:
            inside, current = True, ""
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the section ended
            inside = False
            continue
        match = re.match(r"^ {4}([\w, ]+):\s*(.*)$", line)
        if match and all(part.strip() in names for part in match.group(1).split(",")):
            current = match.group(1)
            entries[current] = match.group(2)
        elif current and line.strip():
            entries[current] += " " + line.strip()
    return _split_entries(entries, names)


def _split_entries(entries: dict[str, str], names: set[str]) -> dict[str, str]:
    """``"a, b: text"`` documents both; ``"a: text; b: other"`` documents each with its own text."""
    result: dict[str, str] = {}
    for key, text in entries.items():
        pieces = re.split(r";\s*(\w+):\s*", text)
        own, rest = pieces[0], pieces[1:]
        for name, other in zip(rest[::2], rest[1::2]):
            if name in names:
                result[name] = _one_paragraph(other)
            else:
                own += f"; {name}: {other}"
        for name in key.split(","):
            result[name.strip()] = _one_paragraph(own)
    return result


def _one_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())
