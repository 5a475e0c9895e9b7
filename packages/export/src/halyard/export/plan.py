"""The correspondence between a Halyard model's parameters and a checkpoint's tensor names and shapes.

Both directions start here: `leaf_plans` pairs every NamedArray leaf of a (possibly abstract) model with
its `TensorMapping` and the axis sizes on the Hugging Face side, and `expected_tensors` lists every
tensor name the checkpoint must hold with its shape.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import jax

from halyard.models.hf.tensor_mapping import TensorMapping
from halyard.named import NamedArray, is_named


def _key_part(entry: Any) -> str:
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def named_leaves(model: Any) -> tuple[list[tuple[str, Any]], Any]:
    """``([(dotted path, leaf), ...], treedef)`` with NamedArrays as leaves (``embed.weight``...)."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(model, is_leaf=is_named)
    return [(".".join(_key_part(p) for p in path), leaf) for path, leaf in with_paths], treedef


@dataclasses.dataclass(frozen=True)
class LeafPlan:
    """One Halyard parameter and how to find it in the checkpoint.

    Attributes:
        path: dotted path in the model.
        leaf: the NamedArray (abstract or concrete).
        mapping: its `TensorMapping`.
        hf_sizes: axis sizes on the Hugging Face side (the unpadded vocabulary).
    """

    path: str
    leaf: NamedArray
    mapping: TensorMapping
    hf_sizes: dict[str, int]

    @property
    def stacked_sizes(self) -> list[int]:
        """Sizes of the stacked (per-tensor) leading axes."""
        return [axis.size for axis in self.leaf.axes[: len(self.mapping.stacked)]]

    def stacked_indices(self) -> Iterator[dict[str, int]]:
        """Every combination of stacked indices (one dict per Hugging Face tensor)."""
        names = self.mapping.stacked
        for combination in itertools.product(*(range(size) for size in self.stacked_sizes)):
            yield dict(zip(names, combination))

    def hf_shape(self) -> tuple[int, ...]:
        """The shape of each Hugging Face tensor of this parameter."""
        return self.mapping.hf_shape(self.hf_sizes)


def leaf_plans(model: Any, mappings: list[TensorMapping], hf_vocab_size: int) -> list[LeafPlan]:
    """Pair every NamedArray of ``model`` with its mapping.

    Args:
        model: a Halyard model, concrete or from ``eqx.filter_eval_shape``.
        mappings: the family's mappings (`halyard.models.hf.HfFamily.mappings`).
        hf_vocab_size: the vocabulary size on the Hugging Face side (the model's may be padded above it).

    Raises:
        RuntimeError: a parameter without a mapping or a mapping whose axes disagree with the model's
            (a bug in the family table, not in the checkpoint).
    """
    by_path = {mapping.path: mapping for mapping in mappings}
    leaves, _ = named_leaves(model)
    plans = []
    for path, leaf in leaves:
        if not is_named(leaf):
            raise RuntimeError(f"model parameter {path!r} is a plain array; only NamedArrays can be mapped")
        mapping = by_path.pop(path, None)
        if mapping is None:
            raise RuntimeError(f"no Hugging Face mapping for Halyard parameter {path!r} {leaf.axes}")
        names = [axis.name for axis in leaf.axes]
        if names != mapping.stacked + mapping.target:
            raise RuntimeError(
                f"mapping of {path!r} expects axes {mapping.stacked + mapping.target}, the model has {names}"
            )
        sizes = {axis.name: axis.size for axis in leaf.axes}
        if "vocab" in sizes:
            if hf_vocab_size > sizes["vocab"]:
                raise ValueError(
                    f"{path!r}: the checkpoint's vocabulary ({hf_vocab_size}) is larger than the model's "
                    f"({sizes['vocab']})"
                )
            sizes["vocab"] = hf_vocab_size
        plans.append(LeafPlan(path, leaf, mapping, sizes))
    if by_path:
        raise RuntimeError(f"mappings for parameters the model does not have: {sorted(by_path)}")
    return plans


def expected_tensors(plans: list[LeafPlan]) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name the plans read or write, with its shape, in model order."""
    expected: dict[str, tuple[int, ...]] = {}
    for plan in plans:
        shape = plan.hf_shape()
        for indices in plan.stacked_indices():
            expected[plan.mapping.key(indices)] = shape
    return expected
