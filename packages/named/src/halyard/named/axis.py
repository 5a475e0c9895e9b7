"""Axes: a name and a size. Plain strings select an axis where only the name matters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Axis:
    """A named dimension of a `NamedArray`.

    Args:
        name: the axis' name, e.g. ``"embed"``; names in one array are unique.
        size: its length (a non-negative int).
    """

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Axis name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise TypeError(f"Axis {self.name!r}: size must be a non-negative int, got {self.size!r}")

    def resize(self, size: int) -> Axis:
        """The same name with another size."""
        return Axis(self.name, size)

    def alias(self, name: str) -> Axis:
        """The same size under another name."""
        return Axis(name, self.size)

    def __repr__(self) -> str:
        return f"Axis({self.name!r}, {self.size})"


AxisSelector: TypeAlias = Axis | str
"""An axis by name (a str) or an `Axis` (whose size is then checked)."""
AxisSpec: TypeAlias = Axis | Sequence[Axis]
AxisSelection: TypeAlias = AxisSelector | Sequence[AxisSelector]


def axis_name(axis: AxisSelector) -> str:
    """The name of an axis or a name."""
    if isinstance(axis, Axis):
        return axis.name
    if isinstance(axis, str):
        return axis
    raise TypeError(f"Expected an Axis or an axis name (str), got {axis!r}")


def as_tuple(selection: AxisSelection) -> tuple:
    """One selector or several, always as a tuple."""
    if isinstance(selection, Axis | str):
        return (selection,)
    return tuple(selection)


def format_axes(axes: Sequence[Axis]) -> str:
    """``(batch=4, embed=64)``: how errors print an array's axes."""
    return "(" + ", ".join(f"{a.name}={a.size}" for a in axes) + ")"


def check_unique(axes: Sequence[Axis]) -> None:
    """Raise ValueError when two axes share a name."""
    seen: set[str] = set()
    for axis in axes:
        if axis.name in seen:
            raise ValueError(f"Axis names must be unique, but {axis.name!r} repeats in {format_axes(axes)}")
        seen.add(axis.name)
