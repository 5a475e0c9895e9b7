"""Higher-order functions over a named axis: `vmap`, `scan`, `fold`.

Each takes a function and the axis to map or loop over (an `Axis`, or a name when the size can be
read off the arguments). Inside the function, NamedArrays that had the axis arrive without it; results
that are NamedArrays get it back (in front). Leaves of the argument pytrees are treated as follows:

- a NamedArray with the axis: mapped / sliced along it, by name (its position does not matter);
- a NamedArray without the axis: passed whole to every step (broadcast);
- a plain array: mapped along dimension ``unnamed_axis`` when that is an int, else broadcast;
- anything else (Python numbers, strings, None): passed unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray, is_named

RematPolicy = bool | Callable[..., bool] | None
"""``None``/``False``: no remat; ``True``: save nothing (recompute all); a callable: a
``jax.checkpoint_policies`` policy deciding what to save."""


class _Leaf:
    """How one input leaf travels through the transform (see the module docstring)."""

    __slots__ = ("axes", "kind", "mapped_dim", "value")

    def __init__(self, kind: str, value: Any, mapped_dim: int | None, axes: tuple[Axis, ...] = ()):
        self.kind = kind  # "named", "array" or "static"
        self.value = value
        self.mapped_dim = mapped_dim
        self.axes = axes


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | jnp.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype"))


def _classify(leaves: Sequence[Any], name: str, unnamed_axis: int | None) -> list[_Leaf]:
    result = []
    for leaf in leaves:
        if isinstance(leaf, NamedArray):
            if leaf.has_axis(name):
                k = leaf.axis_index(name)
                result.append(_Leaf("named", leaf.array, k, leaf.axes[:k] + leaf.axes[k + 1 :]))
            else:
                result.append(_Leaf("named", leaf.array, None, leaf.axes))
        elif _is_array(leaf) and getattr(leaf, "ndim", 0) > 0:
            result.append(_Leaf("array", leaf, unnamed_axis))
        elif _is_array(leaf):
            result.append(_Leaf("array", leaf, None))
        else:
            result.append(_Leaf("static", leaf, None))
    return result


def _resolve_axis(axis: AxisSelector, leaves: Sequence[_Leaf], raw: Sequence[Any], what: str) -> Axis:
    """The mapped Axis with its size, checked against every argument that has it."""
    name = axis_name(axis)
    size = axis.size if isinstance(axis, Axis) else None
    for info in leaves:
        if info.mapped_dim is None:
            continue
        found = info.value.shape[info.mapped_dim]
        if size is None:
            size = found
        elif found != size:
            described = [format_axes(r.axes) for r in raw if isinstance(r, NamedArray) and r.has_axis(name)]
            raise ValueError(
                f"{what}: axis {name!r} must have one size, but arguments have sizes {size} and {found} "
                f"(named arguments with it: {', '.join(described) or 'none'})"
            )
    if size is None:
        raise ValueError(
            f"{what}: no argument has axis {name!r}, so its size is unknown; pass an Axis({name!r}, size) "
            f"instead of the name, or give an argument with that axis"
        )
    return Axis(name, size)


def _rebuild(leaves: Sequence[_Leaf], values: Sequence[Any]) -> list[Any]:
    """Leaves as the function sees them, from the (possibly sliced) raw values."""
    out = []
    for info, value in zip(leaves, values):
        if info.kind == "named":
            out.append(NamedArray(value, info.axes))
        else:
            out.append(value)
    return out


class _Outputs:
    """Splits a function's result into raw arrays (that cross the transform) and the rest."""

    def __init__(self) -> None:
        self.treedef: Any = None
        self.specs: list[tuple[str, Any]] = []

    def split(self, tree: Any) -> list[Any]:
        leaves, self.treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_named)
        arrays, self.specs = [], []
        for leaf in leaves:
            if isinstance(leaf, NamedArray):
                self.specs.append(("named", leaf.axes))
                arrays.append(leaf.array)
            elif _is_array(leaf):
                self.specs.append(("array", None))
                arrays.append(leaf)
            else:
                self.specs.append(("static", leaf))
        return arrays

    def join(self, arrays: Sequence[Any], axis: Axis) -> Any:
        iterator = iter(arrays)
        leaves = []
        for kind, info in self.specs:
            if kind == "named":
                leaves.append(NamedArray(next(iterator), (axis,) + info))
            elif kind == "array":
                leaves.append(next(iterator))
            else:
                leaves.append(info)
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _remat(fn: Callable[..., Any], remat: RematPolicy) -> Callable[..., Any]:
    if remat is None or remat is False:
        return fn
    if remat is True:
        return jax.checkpoint(fn)
    if callable(remat):
        return jax.checkpoint(fn, policy=remat)
    raise TypeError(f"remat must be None, a bool or a jax.checkpoint_policies policy, got {remat!r}")


def vmap(
    fn: Callable[..., Any], axis: AxisSelector, *, unnamed_axis: int | None = None
) -> Callable[..., Any]:
    """Map ``fn`` over ``axis``: ``vmap(layer_norm, "batch")(x)`` runs once per batch element.

    Inside ``fn``, ``axis`` is also the collective axis name (``jax.lax.psum(v, "batch")`` works).

    Args:
        fn: the function to map; its arguments and results are pytrees of NamedArrays and arrays.
        axis: the axis mapped over (a name, or an `Axis` when no argument has it and the size must be given).
        unnamed_axis: the dimension of plain (unnamed) arrays to map over, e.g. ``0`` for a stack of keys;
            ``None`` (default) passes plain arrays whole to every call.

    Returns:
        A function with ``fn``'s signature whose NamedArray results carry ``axis`` first and whose plain
        array results have the mapped dimension first.

    Raises:
        ValueError: no argument has ``axis`` and only its name was given, or arguments disagree on its size.
    """
    name = axis_name(axis)

    def mapped(*args: Any, **kwargs: Any) -> Any:
        raw, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_named)
        leaves = _classify(raw, name, unnamed_axis)
        resolved = _resolve_axis(axis, leaves, raw, "vmap")
        traced = [i for i, info in enumerate(leaves) if info.kind != "static"]
        outputs = _Outputs()

        def inner(*values: Any) -> list[Any]:
            current = [info.value for info in leaves]
            for i, value in zip(traced, values):
                current[i] = value
            call_args, call_kwargs = jax.tree_util.tree_unflatten(treedef, _rebuild(leaves, current))
            return outputs.split(fn(*call_args, **call_kwargs))

        in_axes = tuple(leaves[i].mapped_dim for i in traced)
        result = jax.vmap(inner, in_axes=in_axes, out_axes=0, axis_name=name, axis_size=resolved.size)(
            *(leaves[i].value for i in traced)
        )
        return outputs.join(result, resolved)

    mapped.__name__ = getattr(fn, "__name__", "mapped")
    mapped.__doc__ = fn.__doc__
    return mapped


def scan(
    fn: Callable[..., tuple[Any, Any]],
    axis: AxisSelector,
    *,
    remat: RematPolicy = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    unnamed_axis: int | None = 0,
) -> Callable[..., tuple[Any, Any]]:
    """Loop ``fn(carry, *xs) -> (carry, y)`` over ``axis``, like ``jax.lax.scan`` but by name.

    ``scan(block, "layers")(h, stacked_params)`` calls ``block(h, params_of_layer_i)`` for each layer,
    where ``stacked_params`` holds NamedArrays with a ``layers`` axis (anywhere in their axes).

    Args:
        fn: the step; ``carry`` is any pytree that keeps its structure and axes from step to step, the
            ``xs`` arrive sliced along ``axis``; ``y`` is any pytree (or None).
        axis: the axis looped over (a name, or an `Axis` when no ``xs`` has it, for a pure loop).
        remat: rematerialization of each step: ``None``/``False`` none, ``True`` recompute everything
            in the backward pass, or a ``jax.checkpoint_policies`` policy (e.g. ``dots_saveable``).
        reverse: loop from the last index to the first (``ys`` are still stored in index order).
        unroll: steps per loop iteration, as in ``jax.lax.scan``.
        unnamed_axis: the dimension of plain arrays in ``xs`` to slice (``0``, like ``jax.lax.scan``);
            ``None`` passes them whole to every step.

    Returns:
        A function ``(init, *xs) -> (carry, ys)``; NamedArrays in ``ys`` have ``axis`` first, plain arrays
        in ``ys`` have the stacked dimension first.

    Raises:
        ValueError: no ``xs`` has the axis and only its name was given, or the ``xs`` disagree on its size.
    """
    name = axis_name(axis)

    def scanned(init: Any, *xs: Any) -> tuple[Any, Any]:
        raw, treedef = jax.tree_util.tree_flatten(xs, is_leaf=is_named)
        leaves = _classify(raw, name, unnamed_axis)
        resolved = _resolve_axis(axis, leaves, raw, "scan")
        sliced = [i for i, info in enumerate(leaves) if info.mapped_dim is not None]
        stacked = [jnp.moveaxis(leaves[i].value, leaves[i].mapped_dim or 0, 0) for i in sliced]
        outputs = _Outputs()

        def step(carry: Any, values: list[Any]) -> tuple[Any, list[Any]]:
            current = [info.value for info in leaves]
            for i, value in zip(sliced, values):
                current[i] = value
            step_xs = jax.tree_util.tree_unflatten(treedef, _rebuild(leaves, current))
            new_carry, y = fn(carry, *step_xs)
            return new_carry, outputs.split(y)

        carry, ys = jax.lax.scan(
            _remat(step, remat), init, stacked, length=resolved.size, reverse=reverse, unroll=unroll
        )
        return carry, outputs.join(ys, resolved)

    scanned.__name__ = getattr(fn, "__name__", "scanned")
    scanned.__doc__ = fn.__doc__
    return scanned


def fold(
    fn: Callable[..., Any],
    axis: AxisSelector,
    *,
    remat: RematPolicy = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    unnamed_axis: int | None = 0,
) -> Callable[..., Any]:
    """Loop ``fn(carry, *xs) -> carry`` over ``axis`` and return the final carry (a `scan` without ``ys``).

    ``fold(block, "layers")(h, stacked_params)`` applies every layer in turn. Arguments as in `scan`.
    """

    def step(carry: Any, *xs: Any) -> tuple[Any, None]:
        return fn(carry, *xs), None

    looped = scan(step, axis, remat=remat, reverse=reverse, unroll=unroll, unnamed_axis=unnamed_axis)

    def folded(init: Any, *xs: Any) -> Any:
        return looped(init, *xs)[0]

    folded.__name__ = getattr(fn, "__name__", "folded")
    folded.__doc__ = fn.__doc__
    return folded
