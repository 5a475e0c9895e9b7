"""Several LoRA adapters served beside their base in one batch (S-LoRA / Punica's per-row adapters).

Each targeted projection of the base becomes an `AdaptedLinear`: the base weight, plus every adapter's A
and B stacked on an ``lora_adapters`` axis, index 0 all zeros (the base itself), ranks padded with zeros to
the largest. A step gives each token the index of its request's adapter (``rows``); the layer computes the
base product once for all tokens and adds ``((x · A_all) * select) · B_all``, where ``select`` keeps, per
token, its own adapter's ``rank`` columns scaled by its ``alpha / rank`` and zeroes the others. Two dense
products of width ``adapters x rank``, no gather of weights per token: what the other rows ask for never
enters a row's numbers (their columns are exact zeros in its sums), and a base row adds exact zeros. A step
of base rows only runs the program without adapters (``rows`` None: the plain products).

    model = with_adapters(base, [("sql", sql_adapters), ("chat", chat_adapters)])   # indices 1 and 2
    model = with_rows(model, named(indices, ("pos",)))                            # inside a step program
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.lora import RANK, TARGET_MODULES, Adapters, LoraAdapter, module_path
from halyard.named import Axis, NamedArray, named
from halyard.named.nn import Linear

ADAPTERS = "lora_adapters"
"""The axis the served adapters are stacked on (index 0: none)."""

M = TypeVar("M", bound=eqx.Module)


class AdapterError(ValueError):
    """An adapter that does not fit the served base (one line naming the adapter and the fix)."""


class AdaptedLinear(Linear):
    """A `Linear` plus one low-rank update per row, chosen from stacked adapters by ``rows``.

    Attributes:
        lora_a: A of every adapter, ``(layers, lora_adapters, in..., lora_rank)``.
        lora_b: B of every adapter, ``(layers, lora_adapters, lora_rank, out...)``.
        scales: each adapter's ``alpha / rank`` (0 for index 0), ``(layers, lora_adapters)``.
        rows: each token's adapter index, ``(layers, pos)`` (the same for every layer), set by `with_rows`
            for one step; None: every row is the base.
    """

    lora_a: NamedArray | None = None
    lora_b: NamedArray | None = None
    scales: NamedArray | None = None
    rows: NamedArray | None = None

    def __call__(self, x: NamedArray) -> NamedArray:
        y = super().__call__(x)
        if self.rows is None or self.lora_a is None or self.lora_b is None or self.scales is None:
            return y  # a step of base rows only
        Adapters, Rank = self.lora_a.axis(ADAPTERS), self.lora_a.axis(RANK)
        down = Linear(self.lora_a, None, self.In, (Adapters, Rank), self.dot_general)(x)
        rows = self.rows
        chosen = named(jax.nn.one_hot(rows.array, Adapters.size, dtype=jnp.float32), (*rows.axes, Adapters))
        select = (chosen * self.scales.astype(jnp.float32)).astype(down.dtype)
        update = Linear(self.lora_b, None, (Adapters, Rank), self.Out, self.dot_general)(down * select)
        return y + update.astype(y.dtype)


def adapter_count(model: eqx.Module) -> int:
    """How many adapters ``model`` serves besides its base (0: a plain model)."""
    for name in TARGET_MODULES:
        layer = _get(model, module_path(name))
        if isinstance(layer, AdaptedLinear) and layer.lora_a is not None:
            return layer.lora_a.axis_size(ADAPTERS) - 1
    return 0


def with_rows(model: M, rows: NamedArray) -> M:
    """``model`` with every `AdaptedLinear` computing token ``i`` with adapter ``rows[i]`` (``rows``: int
    ``(pos,)``, 0 for the base)."""
    for name in TARGET_MODULES:
        path = module_path(name)
        layer = _get(model, path)
        if isinstance(layer, AdaptedLinear):
            Layers = layer.weight.axes[0]
            per_layer = named(
                jnp.broadcast_to(rows.array, (Layers.size, *rows.array.shape)), (Layers, *rows.axes)
            )
            model = _set(model, path, dataclasses.replace(layer, rows=per_layer))
    return model


def with_adapters(model: M, adapters: Sequence[tuple[str, Adapters]]) -> M:
    """``model`` serving ``adapters`` (named, in order: index ``i + 1`` is ``adapters[i]``) beside its base.

    The targets are the union of the adapters'; an adapter without one of them adds zeros there. Ranks may
    differ (padded with zeros to the largest).

    Raises:
        AdapterError: no adapters, a target that is no linear layer of the base, or an adapter whose
            shapes do not fit the base's layer (its layers, input or output sizes).
    """
    if not adapters:
        raise AdapterError("with_adapters: no adapters given")
    targets = [name for name in TARGET_MODULES if any(name in found for _, found in adapters)]
    rank = max(adapter.rank for _, found in adapters for adapter in found.values())
    for name in targets:
        path = module_path(name)
        base = _get(model, path)
        if type(base) is not Linear:  # a LoraLinear (a LoRA run served as the base), an Int8Linear...
            raise AdapterError(
                f"adapter {_first_with(adapters, name)!r} targets {name}, which is no plain linear layer of the "
                f"served model (a {type(base).__name__}); serve a base without adapters (halyard export --lora "
                "merge) in its stored dtype"
            )
        stacks = [_padded(base, None, rank)] + [
            _padded(base, (label, found.get(name)), rank) for label, found in adapters
        ]
        lora_a = _stack([a for a, _, _ in stacks])
        lora_b = _stack([b for _, b, _ in stacks])
        Layers = base.weight.axes[0]
        scale = jnp.asarray([s for _, _, s in stacks], jnp.float32)
        scales = named(
            jnp.broadcast_to(scale, (Layers.size, len(stacks))), (Layers, Axis(ADAPTERS, len(stacks)))
        )
        adapted = AdaptedLinear(
            base.weight, base.bias, base.In, base.Out, base.dot_general, lora_a, lora_b, scales
        )
        model = _set(model, path, adapted)
    return model


def _get(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = getattr(model, part, None)
    return model


def _set(model: Any, path: str, value: Any) -> Any:
    return eqx.tree_at(lambda node: _get(node, path), model, value)


def _first_with(adapters: Sequence[tuple[str, Adapters]], target: str) -> str:
    return next(label for label, found in adapters if target in found)


def _padded(
    base: Linear, adapter: tuple[str, LoraAdapter | None] | None, rank: int
) -> tuple[NamedArray, NamedArray, float]:
    """One adapter's A and B for ``base`` in the base's dtype, rank padded to ``rank`` (zeros when absent)."""
    Layers = base.weight.axes[0]
    Rank = Axis(RANK, rank)
    a_axes, b_axes = (Layers, *base.In, Rank), (Layers, Rank, *base.Out)
    found = None if adapter is None else adapter[1]
    if found is None:
        zeros = lambda axes: named(jnp.zeros(tuple(a.size for a in axes), base.weight.dtype), axes)
        return zeros(a_axes), zeros(b_axes), 0.0
    label = adapter[0] if adapter is not None else ""
    expected = {axis.name: axis.size for axis in (Layers, *base.In, *base.Out)}
    given = {axis.name: axis.size for axis in (*found.lora_a.axes, *found.lora_b.axes) if axis.name != RANK}
    if given != expected:
        raise AdapterError(
            f"adapter {label!r} does not fit the served model: its shapes {given} differ from the base layer's "
            f"{expected}; serve it with the base it was trained on"
        )
    pad = rank - found.rank
    lora_a = found.lora_a.rearrange(*(axis.name for axis in a_axes))
    lora_b = found.lora_b.rearrange(*(axis.name for axis in b_axes))
    a = jnp.pad(lora_a.array.astype(base.weight.dtype), [(0, 0)] * (lora_a.ndim - 1) + [(0, pad)])
    b = jnp.pad(lora_b.array.astype(base.weight.dtype), [(0, 0), (0, pad)] + [(0, 0)] * (lora_b.ndim - 2))
    return named(a, a_axes), named(b, b_axes), found.scale


def _stack(arrays: list[NamedArray]) -> NamedArray:
    """``arrays`` stacked on `ADAPTERS`, after their first (layers) axis."""
    first = arrays[0]
    stacked = jnp.stack([array.array for array in arrays], axis=1)
    return named(stacked, (first.axes[0], Axis(ADAPTERS, len(arrays)), *first.axes[1:]))
