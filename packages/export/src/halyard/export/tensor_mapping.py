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

import numpy as np

Reader = Callable[[tuple[slice, ...]], np.ndarray]
"""Reads a rectangular block (one slice per dimension) of one Hugging Face tensor."""

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


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
            of which this parameter is entry ``index``; None when there is none.
    """

    path: str
    hf_key: str
    pattern: str
    part: tuple[str, int, int] | None = None

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

    @property
    def view_names(self) -> list[str]:
        """Every left-side axis name in order."""
        return [name for group in self.groups for name in group]

    def key(self, indices: Mapping[str, int]) -> str:
        """The Hugging Face tensor name for one index along each stacked axis."""
        return self.hf_key.format(**indices)

    def sizes_with_part(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """``sizes`` plus the part dimension's size."""
        result = dict(sizes)
        if self.part is not None:
            result[self.part[0]] = self.part[2]
        return result

    def hf_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Shape of the Hugging Face tensor given every axis size (Hugging Face side: unpadded vocab)."""
        full = self.sizes_with_part(sizes)
        return tuple(math.prod(full[name] for name in group) for group in self.groups)

    def _ranges(self, target_slices: Sequence[slice], sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
        ranges = {name: (0, size) for name, size in self.sizes_with_part(sizes).items()}
        for name, part_slice in zip(self.target, target_slices):
            start, stop, _ = part_slice.indices(sizes[name])
            ranges[name] = (start, stop)
        if self.part is not None:
            ranges[self.part[0]] = (self.part[1], self.part[1] + 1)
        return ranges

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
        for group in self.groups:
            inner = math.prod(full[name] for name in group[1:])
            start, stop = ranges[group[0]]
            hf_slices.append(slice(start * inner, stop * inner))
            read_shape += [stop - start] + [full[name] for name in group[1:]]
            trims += [slice(None)] + [slice(*ranges[name]) for name in group[1:]]
        view = np.asarray(reader(tuple(hf_slices))).reshape(read_shape)[tuple(trims)]
        names = self.view_names
        if self.part is not None:
            view = view.squeeze(names.index(self.part[0]))
            names = [name for name in names if name != self.part[0]]
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
        names = [name for name in self.view_names if self.part is None or name != self.part[0]]
        arranged = block.transpose([self.target.index(name) for name in names])
        where = dict(zip(self.target, target_slices)) if target_slices is not None else {}
        index = tuple(
            self.part[1] if self.part is not None and name == self.part[0] else where.get(name, slice(None))
            for name in self.view_names
        )
        view[index] = arranged
