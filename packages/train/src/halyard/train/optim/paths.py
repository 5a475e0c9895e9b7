"""Naming parameters by their path, and mapping a function over the parameters of a model tree.

Parameters are pytrees whose leaves are `NamedArray`s or plain arrays. Optax masks, labels and
multipliers must have the exact leaf structure of the parameters, so `map_parameters` visits each
parameter once (a `NamedArray` as a whole, with its axis names) and puts the result where its array was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import optax

from halyard.named import NamedArray

BATCH_AXIS_NAMES = ("layers", "experts")
"""Axis names that stack independent parameters (scanned layers, experts): they never count as a
parameter's own dimensions (a stacked norm scale with axes (layers, embed) is still a vector)."""

NO_DECAY_PATTERN = re.compile(
    r"(^|[._])(bias|biases|norm|norms|ln|ln_\w+|layernorm|rmsnorm|scale|embed\w*|wte|wpe)$"
)
"""Path components of parameters that get no weight decay by default: biases, norm gains, embeddings."""

EMBEDDING_PATTERN = re.compile(r"(^|[._])(embed\w*|wte|wpe|lm_head|unembed\w*|token_embeddings?)$")
"""Path components of embedding and unembedding tables (kept on AdamW by Muon, not decayed)."""


def path_name(path: tuple[Any, ...]) -> str:
    """A dotted name for a pytree key path: `('blocks', 0, 'mlp', 'weight')` -> `"blocks.0.mlp.weight"`.

    Args:
        path: a key path from `jax.tree_util.tree_flatten_with_path`.
    """
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        else:
            parts.append(str(getattr(key, "key", key)))
    return ".".join(parts)


def is_parameter_node(node: Any) -> bool:
    """True for the nodes `map_parameters` treats as one parameter: a NamedArray, or an optax MaskedNode."""
    return isinstance(node, NamedArray | optax.MaskedNode)


def map_parameters(fn: Callable[[str, Any], Any], params: Any) -> Any:
    """Apply `fn(name, parameter)` to every parameter; the result has the exact leaf structure of `params`.

    Args:
        fn: called with the dotted path name and the parameter (a `NamedArray` or a plain array); its
            result is placed where the parameter's array was (inside the NamedArray node, so the tree
            lines up leaf for leaf with `params`, as optax masks and labels require).
        params: the parameter pytree. Entries masked out by optax (`optax.MaskedNode`) are kept as they are.
    """

    def visit(path: tuple[Any, ...], node: Any) -> Any:
        if isinstance(node, optax.MaskedNode):
            return node
        if isinstance(node, NamedArray):
            if isinstance(node.array, optax.MaskedNode):
                return node
            return NamedArray.tree_unflatten(node.axes, (fn(path_name(path), node),))
        return fn(path_name(path), node)

    return jax.tree_util.tree_map_with_path(visit, params, is_leaf=is_parameter_node)


def own_ndim(parameter: Any) -> int:
    """Number of dimensions of a parameter not counting stacking axes (`BATCH_AXIS_NAMES`) of a NamedArray.

    Args:
        parameter: a `NamedArray` or a plain array.
    """
    if isinstance(parameter, NamedArray):
        return sum(1 for axis in parameter.axes if axis.name not in BATCH_AXIS_NAMES)
    return parameter.ndim


def is_embedding(name: str, parameter: Any) -> bool:
    """True for embedding / unembedding tables: a `vocab` axis, or a path component like `embed`, `wte`."""
    if isinstance(parameter, NamedArray) and any(axis.name == "vocab" for axis in parameter.axes):
        return True
    return any(EMBEDDING_PATTERN.search(part) for part in name.split("."))


def default_weight_decay_mask(params: Any) -> Any:
    """The default weight-decay mask: True for matrices, False for norms, biases, embeddings and vectors.

    A parameter is decayed when it has at least 2 dimensions of its own (stacking axes `layers`/`experts`
    of a NamedArray do not count), no `vocab` axis, and no path component matching `NO_DECAY_PATTERN`
    (`bias`, `norm`, `ln_1`, `scale`, `embed...`, `wte`, `wpe`).

    Args:
        params: the parameter pytree (or gradients/updates with the same structure).
    """

    def decays(name: str, parameter: Any) -> bool:
        if own_ndim(parameter) < 2 or is_embedding(name, parameter):
            return False
        return not any(NO_DECAY_PATTERN.search(part) for part in name.split("."))

    return map_parameters(decays, params)
