"""Norms and histograms per module and per layer, computed inside the watched step.

A module is a parameter's path without its last name (``layers.attention.q_proj`` for
``layers.stacked.attention.q_proj.weight``; the layer stack's own ``stacked`` field is left out). A parameter
whose first axis is the layer stack's (`LAYERS`) is also split by layer: ``<prefix>/<module>/layers`` and the
stack's total per layer ``<prefix>/layers`` are arrays ``[layers]``, which the host logs as
``<prefix>/<module>/layers/<i>`` and ``<prefix>/layers/<i>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from halyard.named import NamedArray, is_named

LAYERS = "layers"
"""The axis name of the layer stack (`halyard.models`' decoders stack their blocks on it)."""
STACK_FIELD = "stacked"
"""`halyard.named.nn.Stacked`'s field holding the stacked layers: left out of module names."""


def _key_name(entry: Any) -> str:
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _leaves(tree: Any) -> list[tuple[list[str], jax.Array, bool]]:
    """``(path names, array, stacked per layer)`` for every array of ``tree`` (a NamedArray's array)."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named)[0]:
        array = leaf.array if isinstance(leaf, NamedArray) else leaf
        if not isinstance(array, jax.Array) or not jnp.issubdtype(array.dtype, jnp.inexact):
            continue
        stacked = isinstance(leaf, NamedArray) and bool(leaf.axes) and leaf.axes[0].name == LAYERS
        found.append(([_key_name(entry) for entry in path], array, stacked))
    return found


def module_of(names: list[str]) -> str:
    """The module of a parameter path (its names without the last one and without `STACK_FIELD`)."""
    kept = [name for name in names if name != STACK_FIELD]
    return ".".join(kept[:-1] if len(kept) > 1 else kept)


def _squares(array: jax.Array, stacked: bool) -> jax.Array:
    """The sum of squares (float32) of ``array``, per layer (``[layers]``) when ``stacked``."""
    squares = jnp.square(array.astype(jnp.float32))
    return squares.reshape(squares.shape[0], -1).sum(axis=1) if stacked else squares.sum()


def module_norms(
    tree: Any,
    prefix: str,
    group: Callable[[list[str]], str | None] = module_of,
    *,
    stack_total: bool = True,
) -> dict[str, jax.Array]:
    """L2 norms of ``tree``'s groups of leaves, and per layer for those stacked on `LAYERS`.

    Args:
        tree: parameters, gradients, or a tree shaped like them (NamedArray leaves keep their axes).
        prefix: the metric's name (``grad_norm``).
        group: ``path names -> group name`` (default: the module, `module_of`), None leaves a leaf out.
        stack_total: also ``prefix/layers``, every group's stacked leaves together per layer.

    Returns:
        ``{prefix/<group>: scalar, prefix/<group>/layers: [layers], prefix/layers: [layers]}`` (the per-layer
        entries only for groups with stacked leaves), float32.
    """
    totals: dict[str, jax.Array] = {}
    per_layer: dict[str, jax.Array] = {}
    for names, array, stacked in _leaves(tree):
        name = group(names)
        if name is None:
            continue
        squares = _squares(array, stacked)
        if stacked:
            per_layer[name] = per_layer.get(name, 0.0) + squares
            if stack_total:
                per_layer[""] = per_layer.get("", 0.0) + squares
            squares = squares.sum()
        totals[name] = totals.get(name, 0.0) + squares
    norms = {f"{prefix}/{name}": jnp.sqrt(value) for name, value in totals.items()}
    for name, value in per_layer.items():
        norms[f"{prefix}/{name}/{LAYERS}" if name else f"{prefix}/{LAYERS}"] = jnp.sqrt(value)
    return norms


STATE_WRAPPERS = ("inner_state", "inner_states")
"""Names optax's combinators put on the path of a state (`optax.multi_transform`, `optax.masked`)."""


def optimizer_state_norms(
    opt_state: Any, param_names: set[str], prefix: str = "opt_state_norm"
) -> dict[str, jax.Array]:
    """Norms of the optimizer state's parameter-shaped fields: ``prefix/mu``, ``prefix/nu/layers``, ...

    Args:
        opt_state: the optimizer's state.
        param_names: the first names of the parameters' paths (``embed``, ``layers``, ...): a state leaf
            belongs to field ``<the names before them>`` (``mu``; ``adam.mu`` under Muon's split), and a leaf
            whose path holds none of them (a step count, a constant) is left out.
    """

    def field_of(names: list[str]) -> str | None:
        first = next((index for index, name in enumerate(names) if name in param_names), None)
        if first is None:
            return None
        kept = [name for name in names[:first] if not name.isdigit() and name not in STATE_WRAPPERS]
        return ".".join(kept) or "state"

    return module_norms(opt_state, prefix, field_of, stack_total=False)


def top_names(params: Any) -> set[str]:
    """The first names of the paths of ``params``' leaves (``embed``, ``layers``, ``final_norm``, ...)."""
    return {names[0] for names, _, _ in _leaves(params) if names}


def histograms(tree: Any, prefix: str, bins: int) -> dict[str, dict[str, jax.Array]]:
    """A histogram of every module's values: ``{prefix/<module>: {"counts": [bins], "edges": [bins + 1]}}``,
    the bins evenly between the module's smallest and largest value (float32)."""
    values: dict[str, list[jax.Array]] = {}
    for names, array, _ in _leaves(tree):
        values.setdefault(module_of(names), []).append(array.astype(jnp.float32).reshape(-1))
    result = {}
    for name, arrays in values.items():
        flat = jnp.concatenate(arrays)
        low, high = jnp.min(flat), jnp.max(flat)
        high = jnp.where(high > low, high, low + 1.0)  # a constant module: one bin of width 1
        edges = jnp.linspace(low, high, bins + 1)
        index = jnp.clip(((flat - low) / (high - low) * bins).astype(jnp.int32), 0, bins - 1)
        counts = jnp.zeros(bins, jnp.float32).at[index].add(1.0)
        result[f"{prefix}/{name}"] = {"counts": counts, "edges": edges}
    return result
