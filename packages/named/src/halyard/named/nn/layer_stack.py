"""What `Stacked` and `BlockSeq` share: the layer-stack interface and the pytree plumbing behind it."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, format_axes
from halyard.named.core import NamedArray, is_named

M = TypeVar("M")


class LayerStack(eqx.Module, Generic[M]):
    """N layers of one kind applied in sequence; `Stacked` (scan) and `BlockSeq` (unrolled) implement it.

    Both have the same constructor ``init(Layers, Block, *args, key, remat, **kwargs)``, the same
    parameters for the same key, the same ``fold`` / ``scan`` and the same state-dict keys
    (``<field>.<i>.<param>``), so a model can switch between them with one flag.
    """

    @abc.abstractmethod
    def layers(self) -> list[M]:
        """The individual layers, first to last."""

    @abc.abstractmethod
    def with_layers(self, layers: Sequence[M]) -> LayerStack[M]:
        """A stack of the same kind and settings holding ``layers`` instead."""

    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """How many layers the stack holds."""


def check_layers_axis(Layers: Any) -> Axis:
    if not isinstance(Layers, Axis):
        raise TypeError(f"Layers must be an Axis, e.g. Axis('layers', 12), got {Layers!r}")
    if Layers.size < 1:
        raise ValueError(f"A layer stack needs at least one layer, got {Layers!r}")
    return Layers


def block_factory(Block: Any) -> Callable[..., Any]:
    """``Block.init`` for a module class with an ``init`` classmethod, else ``Block`` itself (a factory)."""
    init = getattr(Block, "init", None)
    if callable(init):
        return init
    if callable(Block):
        return Block
    raise TypeError(
        f"Block must be a module class with an init(..., key=...) classmethod or a factory, got {Block!r}"
    )


def layer_keys(key: jax.Array | None, num_layers: int) -> jax.Array | None:
    """One PRNG key per layer (None stays None)."""
    return None if key is None else jax.random.split(key, num_layers)


def add_layers_axis(tree: Any, Layers: Axis) -> Any:
    """Give every NamedArray whose array gained a leading layer dimension the ``Layers`` axis in front."""

    def add(x: Any) -> Any:
        if is_named(x) and x.array is not None:
            if any(a.name == Layers.name for a in x.axes):
                raise ValueError(
                    f"A layer's parameter already has an axis called {Layers.name!r} {format_axes(x.axes)}; "
                    f"name the stack's axis differently"
                )
            return NamedArray(x.array, (Layers, *x.axes))
        return x

    return jax.tree.map(add, tree, is_leaf=is_named)


def layer_view(tree: Any, Layers: Axis) -> Any:
    """The stacked tree with ``Layers`` removed from NamedArray axes but not from their arrays.

    This in-transit form is what ``jax.lax.scan`` slices: each slice then has consistent axes.
    """

    def strip(x: Any) -> Any:
        if not is_named(x):
            return x
        if not x.axes or x.axes[0].name != Layers.name:
            raise ValueError(
                f"Stacked parameter {format_axes(x.axes)} should have the {Layers.name!r} axis first; "
                f"was the stack built by Stacked.init or Stacked.from_layers?"
            )
        return NamedArray.tree_unflatten(x.axes[1:], (x.array,))

    return jax.tree.map(strip, tree, is_leaf=is_named)


def index_layer(tree: Any, Layers: Axis, index: int) -> Any:
    """Layer ``index`` of a stacked tree (NamedArrays lose ``Layers``; plain arrays their first dim)."""
    if not -Layers.size <= index < Layers.size:
        raise IndexError(f"Layer {index} is out of range for {Layers!r}")
    view = layer_view(tree, Layers)

    def pick(x: Any) -> Any:
        if eqx.is_array(x):
            return x[index]
        if isinstance(x, jax.ShapeDtypeStruct):  # abstract templates from jax.eval_shape
            return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
        return x

    return jax.tree.map(pick, view)


def stack_layers(layers: Sequence[Any], Layers: Axis) -> Any:
    """One tree whose arrays stack the layers' arrays along a new leading ``Layers`` dimension.

    Raises:
        ValueError: the layers differ in structure, or a parameter differs in shape between layers.
    """
    if len(layers) != Layers.size:
        raise ValueError(f"{len(layers)} layers were given for {Layers!r}")
    first = layers[0]
    dynamic, static = eqx.partition(first, eqx.is_array)
    reference: Any = jax.tree.structure(dynamic)
    for i, layer in enumerate(layers[1:], start=1):
        if not jax.tree.structure(eqx.filter(layer, eqx.is_array)) == reference:
            raise ValueError(f"Layer {i} does not have the structure (or the axes) of layer 0")

    def stack(*xs: Any) -> Any:
        shapes = {tuple(x.shape) for x in xs}
        if len(shapes) != 1:
            raise ValueError(f"A parameter has different shapes across layers: {sorted(shapes)}")
        return jnp.stack(xs)

    stacked_dynamic = jax.tree.map(stack, *[eqx.filter(layer, eqx.is_array) for layer in layers])
    return add_layers_axis(eqx.combine(stacked_dynamic, static), Layers)


def match_carry(new: Any, old: Any, where: str) -> Any:
    """``new`` with each NamedArray put in ``old``'s axis order, so a loop carry keeps one structure.

    Raises:
        ValueError: a NamedArray of the carry changed its axis names, or the structure changed.
    """

    def fix(n: Any, o: Any) -> Any:
        if is_named(n) and is_named(o):
            if sorted(n.axis_names) != sorted(o.axis_names):
                raise ValueError(
                    f"{where}: a layer must return its input's axes; it got {format_axes(o.axes)} "
                    f"and returned {format_axes(n.axes)}"
                )
            return n.rearrange(*o.axis_names)
        return n

    try:
        return jax.tree.map(fix, new, old, is_leaf=is_named)
    except ValueError as error:
        if "must return its input's axes" in str(error):
            raise
        raise ValueError(
            f"{where}: a layer must return a carry with the structure of its input "
            f"({jax.tree.structure(old, is_leaf=is_named)}), got {jax.tree.structure(new, is_leaf=is_named)}"
        ) from error


class PerLayerInputs:
    """Splits a layer call's extra arguments into per-layer slices and broadcast values.

    A NamedArray argument (anywhere in ``args`` / ``kwargs``) that has the ``Layers`` axis is sliced:
    layer ``i`` receives its ``i``-th slice, without that axis (a per-layer KV cache, for instance).
    Everything else is passed unchanged to every layer.
    """

    def __init__(self, args: tuple, kwargs: dict, Layers: Axis, where: str):
        self._leaves, self._treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_named)
        self.sliced_positions: list[int] = []
        self._sliced_axes: list[tuple[Axis, ...]] = []
        self.sliced: list[jax.Array] = []  # layer dimension first
        for position, leaf in enumerate(self._leaves):
            if is_named(leaf) and leaf.has_axis(Layers.name):
                index = leaf.axis_index(Layers.name)
                if leaf.axes[index].size != Layers.size:
                    raise ValueError(
                        f"{where}: an argument with axes {format_axes(leaf.axes)} has a {Layers.name!r} axis "
                        f"of size {leaf.axes[index].size}, but the stack has {Layers.size} layers"
                    )
                self.sliced_positions.append(position)
                self._sliced_axes.append(leaf.axes[:index] + leaf.axes[index + 1 :])
                self.sliced.append(jnp.moveaxis(leaf.array, index, 0))

    def rebuild(self, slices: Sequence[Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for one layer, given that layer's slice of each sliced argument."""
        leaves = list(self._leaves)
        for position, axes, value in zip(self.sliced_positions, self._sliced_axes, slices):
            leaves[position] = NamedArray(value, axes)
        args, kwargs = jax.tree_util.tree_unflatten(self._treedef, leaves)
        return args, kwargs
