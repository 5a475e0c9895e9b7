"""`LayerStack`: identical decoder layers whose parameters share a leading ``layers`` axis.

One parameter tree serves both execution modes: a scan over ``layers`` (compile time independent of
depth, the default) and an unrolled Python loop (``scan=False``), so switching never changes the
checkpoint. The remat policy decides what the backward pass recomputes per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

import halyard.named as hn
from halyard.named import Axis, NamedArray

LAYERS = "layers"


def _remat_policy(remat: str) -> Any:
    """The ``jax.checkpoint`` policy for a config's ``remat`` name (``None``: no remat)."""
    if remat == "none":
        return None
    if remat in ("full", "nested"):
        return True
    if remat == "save_dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if remat == "offload":
        return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    raise ValueError(f"Unknown remat policy {remat!r}; choose none, full, save_dots, nested or offload")


def _checkpointed(fn: Callable[..., Any], policy: Any) -> Callable[..., Any]:
    if policy is None:
        return fn
    if policy is True:
        return jax.checkpoint(fn)
    return jax.checkpoint(fn, policy=policy)


def _add_axis(tree: Any, axis: Axis) -> Any:
    return jax.tree.map(
        lambda x: NamedArray(x.array, (axis, *x.axes)) if hn.is_named(x) else x, tree, is_leaf=hn.is_named
    )


def _nested_group(num_layers: int) -> int:
    """The largest divisor of ``num_layers`` not above sqrt(num_layers): the inner block of nested remat."""
    best = 1
    for size in range(1, math.isqrt(num_layers) + 1):
        if num_layers % size == 0:
            best = size
    return best


def _unstacked(tree: Any, num_layers: int) -> list[Any]:
    """``tree`` once per layer, every NamedArray without its ``layers`` axis.

    One ``lax.unstack`` per leaf rather than a slice per layer: the gradient of an unstack is a single
    stack, where the gradient of each slice would be a zero-padded full-size array added to the others
    (``num_layers`` full-size writes per parameter).
    """
    leaves, treedef = jax.tree.flatten(tree, is_leaf=hn.is_named)
    per_leaf = []
    for leaf in leaves:
        if isinstance(leaf, NamedArray) and leaf.has_axis(LAYERS):
            axis = leaf.axis_index(LAYERS)
            rest = tuple(a for a in leaf.axes if a.name != LAYERS)
            per_leaf.append([NamedArray(piece, rest) for piece in jax.lax.unstack(leaf.array, axis)])
        else:
            per_leaf.append([leaf] * num_layers)
    return [
        jax.tree.unflatten(treedef, [pieces[index] for pieces in per_leaf]) for index in range(num_layers)
    ]


class LayerStack(eqx.Module):
    """``num_layers`` copies of one layer module, parameters stacked on a ``layers`` axis.

    Attributes:
        layers: the layer module whose every NamedArray leaf has ``layers`` as its first axis.
        num_layers: depth (static).
        scan: scan over the layers (True) or unroll them (static).
        remat: the remat policy name, see `halyard.models.config.ModelConfig` (static).
    """

    layers: Any
    num_layers: int = eqx.field(static=True)
    scan: bool = eqx.field(static=True, default=True)
    remat: str = eqx.field(static=True, default="none")

    @classmethod
    def init(
        cls,
        make_layer: Callable[[jax.Array], eqx.Module],
        num_layers: int,
        *,
        key: jax.Array,
        scan: bool = True,
        remat: str = "none",
    ) -> LayerStack:
        """Create ``num_layers`` layers with independent keys (vmapped, so init cost does not grow with depth).

        Args:
            make_layer: builds one layer from a PRNG key.
            num_layers: depth, at least 1.
            key: PRNG key split into one key per layer.
            scan, remat: execution options (see the attributes).

        Raises:
            ValueError: ``num_layers`` < 1 or an unknown ``remat``.
        """
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        _remat_policy(remat)
        keys = jax.random.split(key, num_layers)
        # vmap batches the arrays but keeps each NamedArray's static axes: add the layers axis back.
        stacked = eqx.filter_vmap(make_layer)(keys)
        return cls(_add_axis(stacked, Axis(LAYERS, num_layers)), num_layers, scan, remat)

    def layer(self, index: int) -> Any:
        """The parameters of layer ``index`` (without the ``layers`` axis)."""
        return jax.tree.map(lambda x: x[LAYERS, index], self.layers, is_leaf=hn.is_named)

    def apply(self, step: Callable[..., tuple[Any, Any]], carry: Any, *xs: Any) -> tuple[Any, Any]:
        """Run ``step(layer, carry, *xs_i) -> (carry, y_i)`` through the layers in order.

        Args:
            step: one layer's computation; ``layer`` is the layer module without the ``layers`` axis.
            carry: the hidden state threaded through the layers.
            xs: per-layer inputs (NamedArrays with a ``layers`` axis, e.g. a KV cache), sliced per layer.

        Returns:
            ``(carry, ys)`` where NamedArrays in ``ys`` gain a leading ``layers`` axis.
        """
        policy = _remat_policy(self.remat)
        if not self.scan:
            return self._unrolled(step, carry, xs, policy)
        if self.remat == "nested" and _nested_group(self.num_layers) > 1:
            return self._nested(step, carry, xs)

        def body(c: Any, layer: Any, *x: Any) -> tuple[Any, Any]:
            return step(layer, c, *x)

        return hn.scan(body, LAYERS, remat=policy)(carry, self.layers, *xs)

    def _unrolled(
        self, step: Callable[..., Any], carry: Any, xs: tuple[Any, ...], policy: Any
    ) -> tuple[Any, Any]:
        run = _checkpointed(step, policy)
        layers = _unstacked(self.layers, self.num_layers)
        inputs = _unstacked(xs, self.num_layers)
        ys = []
        for index in range(self.num_layers):
            carry, y = run(layers[index], carry, *inputs[index])
            ys.append(y)
        stacked = jax.tree.map(
            lambda *leaves: (
                NamedArray(
                    jax.numpy.stack([leaf.array for leaf in leaves]),
                    (Axis(LAYERS, len(leaves)), *leaves[0].axes),
                )
                if isinstance(leaves[0], NamedArray)
                else jax.numpy.stack(leaves)
            ),
            *ys,
            is_leaf=hn.is_named,
        )
        return carry, stacked

    def _nested(self, step: Callable[..., Any], carry: Any, xs: tuple[Any, ...]) -> tuple[Any, Any]:
        """sqrt(L) remat: an outer scan over groups keeps only group inputs; each group is recomputed."""
        inner = _nested_group(self.num_layers)
        outer = self.num_layers // inner
        split = lambda x: NamedArray(
            x.array.reshape(outer, inner, *x.array.shape[1:]),
            (Axis("layer_groups", outer), Axis(LAYERS, inner), *x.axes[1:]),
        )
        merge = lambda x: NamedArray(
            x.array.reshape(outer * inner, *x.array.shape[2:]), (Axis(LAYERS, outer * inner), *x.axes[2:])
        )
        grouped_layers, grouped_xs = jax.tree.map(split, (self.layers, xs), is_leaf=hn.is_named)

        def group(c: Any, layers: Any, *x: Any) -> tuple[Any, Any]:
            def body(ci: Any, layer: Any, *xi: Any) -> tuple[Any, Any]:
                return step(layer, ci, *xi)

            return hn.scan(body, LAYERS, remat=True)(c, layers, *x)

        carry, ys = hn.scan(group, "layer_groups", remat=True)(carry, grouped_layers, *grouped_xs)
        return carry, jax.tree.map(merge, ys, is_leaf=hn.is_named)
