"""`TensorMapping`: how one Halyard parameter is laid out in Hugging Face tensors, both directions.

A mapping is written like an einops pattern from the Hugging Face tensor to the Halyard array::

    TensorMapping("layers.layers.attention.q_proj.weight",
                  "model.layers.{layers}.self_attn.q_proj.weight",
                  "(heads head_size) embed -> embed heads head_size")

The left side lists the Hugging Face tensor's dimensions; a parenthesised group is one dimension that
holds several Halyard axes in row-major order. The right side is the Halyard array's axis order without
its stacked axes: each ``{name}`` placeholder in the key stands for one leading Halyard axis of that
name, and each index along it is a separate Hugging Face tensor (``layers``: one tensor per layer;
Mixtral's ``experts``: one per expert). ``part`` names a dimension that appears only on the left, fixed
at one index (GPT-2 stores q, k and v in one ``c_attn`` tensor: ``("qkv", 1, 3)`` is the key part).
Given by their sizes instead of a count, parts are concatenated along the dimension their name leads, each
as long as its size in entries of the axis after the name; they may differ (Phi-3's ``qkv_proj`` with
grouped-query heads: the key part of ``(qkv kv_heads head_size) embed`` is
``("qkv", 1, (heads, kv_heads, kv_heads))``, which starts ``heads * head_size`` rows in), and a block
sliced along that axis is read exactly (a counted part is read whole, then trimmed).

Because the mapping is only a split of dimensions and a permutation, any rectangular block of the
Halyard array comes from one contiguous range per Hugging Face dimension (`TensorMapping.read`), which
is what lets every device read only its own slice of a checkpoint.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

Reader = Callable[[tuple[slice, ...]], np.ndarray]
"""Reads a rectangular block (one slice per dimension) of one Hugging Face tensor."""

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class _SizedPart(NamedTuple):
    """A part among parts given by their sizes: ``name`` leads its dimension, and this parameter's entries
    of axis ``counted`` start ``offset`` entries in, ``size`` of the dimension's ``total``."""

    name: str
    counted: str
    offset: int
    size: int
    total: int


def _parse_side(text: str) -> list[list[str]]:
    groups: list[list[str]] = []
    for match in re.finditer(r"\(([^)]*)\)|(\S+)", text):
        names = match.group(1).split() if match.group(1) is not None else [match.group(2)]
        if not names:
            raise ValueError(f"empty group '()' in tensor pattern {text!r}")
        groups.append(names)
    return groups


@dataclass(frozen=True)
class TensorMapping:
    """One Halyard parameter and the Hugging Face tensor(s) that hold it.

    Attributes:
        path: dotted path of the NamedArray in the Halyard model (``"embed.weight"``).
        hf_key: the Hugging Face tensor name; ``{axis}`` placeholders index stacked Halyard axes.
        pattern: ``"HF dims -> Halyard axes"`` (see the module docstring).
        part: ``(name, index, count)``: a left-side dimension absent on the right, of size ``count``,
            of which this parameter is entry ``index``; or ``(name, index, sizes)``: ``name`` leads its
            group, which concatenates ``len(sizes)`` parts, part ``j`` holding ``sizes[j]`` entries of the
            axis after ``name`` (so ``sizes[index]`` is that axis's size); None when there is none.

    Raises:
        ValueError: a ``part`` index outside the parts, or sizes whose name does not lead a group of at
            least two axes.
    """

    path: str
    hf_key: str
    pattern: str
    part: tuple[str, int, int | tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if self.part is None:
            return
        name, index, count = self.part
        parts = len(count) if isinstance(count, tuple) else count
        if not 0 <= index < parts:
            raise ValueError(f"TensorMapping {self.path!r}: part index {index} is not one of {parts} parts")
        if isinstance(count, tuple) and not any(g[0] == name and len(g) > 1 for g in self.groups):
            raise ValueError(
                f"TensorMapping {self.path!r}: parts of sizes {count} need {name!r} to lead a "
                f"group followed by the axis they count, as in '({name} heads head_size)'; got {self.pattern!r}"
            )

    @cached_property
    def groups(self) -> list[list[str]]:
        """The Hugging Face dimensions, each as the list of view axis names it holds."""
        return _parse_side(self.pattern.split("->")[0])

    @cached_property
    def target(self) -> list[str]:
        """The Halyard axis names in array order (stacked axes excluded)."""
        return [name for group in _parse_side(self.pattern.split("->")[1]) for name in group]

    @cached_property
    def stacked(self) -> list[str]:
        """The Halyard axes that index separate Hugging Face tensors, in key order."""
        return _PLACEHOLDER.findall(self.hf_key)

    @cached_property
    def _sized(self) -> _SizedPart | None:
        """Where this parameter's part lies when the parts differ in size, else None."""
        if self.part is None or not isinstance(self.part[2], tuple):
            return None
        name, index, sizes = self.part[0], self.part[1], self.part[2]
        counted = next(group[1] for group in self.groups if group[0] == name)
        return _SizedPart(name, counted, sum(sizes[:index]), sizes[index], sum(sizes))

    @cached_property
    def _view_groups(self) -> list[list[str]]:
        """`groups` with a sized part's counted axis folded into the part's dimension (of ``sum(sizes)``
        entries), so that the Hugging Face tensor reshapes to the view whatever the part."""
        sized = self._sized
        if sized is None:
            return self.groups
        return [group[:1] + group[2:] if group[0] == sized.name else group for group in self.groups]

    @property
    def view_names(self) -> list[str]:
        """Every left-side axis name in order (sized parts: the counted axis folded into the part's)."""
        return [name for group in self._view_groups for name in group]

    def key(self, indices: Mapping[str, int]) -> str:
        """The Hugging Face tensor name for one index along each stacked axis."""
        return self.hf_key.format(**indices)

    def sizes_with_part(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """``sizes`` plus the part dimension's size (sized parts: the sum of the sizes).

        Raises:
            ValueError: a sized part whose own size is not the counted axis's size in ``sizes``.
        """
        result = dict(sizes)
        sized = self._sized
        if sized is not None:
            if sizes.get(sized.counted, sized.size) != sized.size:
                raise ValueError(
                    f"TensorMapping {self.path!r}: its part of {sized.name!r} holds {sized.size} entries of "
                    f"{sized.counted!r}, but the parameter's {sized.counted!r} is {sizes[sized.counted]}"
                )
            result[sized.name] = sized.total
        elif self.part is not None and isinstance(self.part[2], int):
            result[self.part[0]] = self.part[2]
        return result

    def hf_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Shape of the Hugging Face tensor given every axis size (Hugging Face side: unpadded vocab)."""
        full = self.sizes_with_part(sizes)
        return tuple(math.prod(full[name] for name in group) for group in self._view_groups)

    def _ranges(self, target_slices: Sequence[slice], sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
        ranges = {name: (0, size) for name, size in self.sizes_with_part(sizes).items()}
        for name, part_slice in zip(self.target, target_slices):
            start, stop, _ = part_slice.indices(sizes[name])
            ranges[name] = (start, stop)
        sized = self._sized
        if sized is not None:
            start, stop = ranges.pop(sized.counted)
            ranges[sized.name] = (sized.offset + start, sized.offset + stop)
        elif self.part is not None:
            ranges[self.part[0]] = (self.part[1], self.part[1] + 1)
        return ranges

    def _halyard_names(self) -> list[str]:
        """`view_names` as Halyard axes: a counted part's dimension dropped, a sized part's renamed to the
        axis it counts (its range is this parameter's)."""
        sized = self._sized
        if sized is not None:
            return [sized.counted if n == sized.name else n for n in self.view_names]
        return [n for n in self.view_names if self.part is None or n != self.part[0]]

    def read(self, reader: Reader, sizes: Mapping[str, int], target_slices: Sequence[slice]) -> np.ndarray:
        """The block ``target_slices`` of the Halyard array (one stacked index), read through ``reader``.

        Each Hugging Face dimension is read as the one contiguous range covering the block (exact when
        only its outermost axis is sliced, which is how layouts split weights), then reshaped, trimmed and
        transposed into Halyard order.

        Args:
            reader: reads a block of the Hugging Face tensor given one slice per dimension.
            sizes: every axis size on the Hugging Face side.
            target_slices: one slice per Halyard axis in `target` (stacked axes excluded).
        """
        ranges = self._ranges(target_slices, sizes)
        full = self.sizes_with_part(sizes)
        hf_slices, read_shape, trims = [], [], []
        for group in self._view_groups:
            inner = math.prod(full[name] for name in group[1:])
            start, stop = ranges[group[0]]
            hf_slices.append(slice(start * inner, stop * inner))
            read_shape += [stop - start] + [full[name] for name in group[1:]]
            trims += [slice(None)] + [slice(*ranges[name]) for name in group[1:]]
        view = np.asarray(reader(tuple(hf_slices))).reshape(read_shape)[tuple(trims)]
        if self.part is not None and self._sized is None:
            view = view.squeeze(self.view_names.index(self.part[0]))
        names = self._halyard_names()
        return view.transpose([names.index(name) for name in self.target])

    def place(
        self, view: np.ndarray, block: np.ndarray, target_slices: Sequence[slice] | None = None
    ) -> None:
        """Write a Halyard block (one stacked index, `target` order) into ``view``, the Hugging Face tensor
        reshaped to the left-side axes (`view_names` order).

        Args:
            view: the Hugging Face tensor's view, written in place (values are cast to its dtype).
            block: the Halyard block, axes in `target` order.
            target_slices: where the block lies along each `target` axis; default: the whole array.
        """
        names = self._halyard_names()
        arranged = block.transpose([self.target.index(name) for name in names])
        where: dict[str, slice | int] = dict(zip(self.target, target_slices or ()))
        sized = self._sized
        if sized is not None:
            counted = where.get(sized.counted, slice(None))
            assert isinstance(counted, slice)
            start, stop, _ = counted.indices(sized.size)
            where[sized.name] = slice(sized.offset + start, sized.offset + stop)
        elif self.part is not None:
            where[self.part[0]] = self.part[1]
        view[tuple(where.get(name, slice(None)) for name in self.view_names)] = arranged
