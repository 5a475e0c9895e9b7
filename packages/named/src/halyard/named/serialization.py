"""Module trees to and from flat state dicts: ``{"blocks.0.attn.q.weight": array, ...}``.

Keys are the attribute path to each array joined by dots: equinox module fields by name, list and
tuple items by index, dict entries by key. A NamedArray is one entry (its array, in its own axis
order). A layer stack (`halyard.named.nn.Stacked` or `BlockSeq`) held in field ``layers`` contributes
``layers.0.*``, ``layers.1.*``, ... with each layer's own keys: a `Stacked`'s parameters are unstacked,
so both kinds of stack, and checkpoints or exports made from either, have the same keys.

Fields that are not arrays (static configuration, None, Python numbers) have no entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.named.core import NamedArray, is_named

StateDict = dict[str, Any]


def _is_layer_stack(x: Any) -> bool:
    from halyard.named.nn.layer_stack import LayerStack

    return isinstance(x, LayerStack)


def _is_entry(x: Any) -> bool:
    return is_named(x) or _is_layer_stack(x)


def _key_part(entry: Any) -> str:
    for attribute in ("name", "key", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _join(prefix: str, part: str) -> str:
    return ".".join(p for p in (prefix, part) if p)


def _entries(tree: Any) -> tuple[list[tuple[str, Any]], Any]:
    """(dotted key, leaf) for every array, NamedArray or layer stack, and the treedef to rebuild."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_entry)
    return [(".".join(_key_part(p) for p in path), leaf) for path, leaf in with_paths], treedef


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def _is_array_like(x: Any) -> bool:
    """An array, or an abstract one in a template made by ``jax.eval_shape``."""
    return _is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def to_state_dict(module: Any, prefix: str = "") -> StateDict:
    """Flatten a module tree into ``{dotted key: array}`` (see the module docstring for the keys).

    Args:
        module: an equinox module (or any pytree) holding NamedArrays, arrays and layer stacks.
        prefix: prepended to every key (``"model"`` gives ``"model.embed.weight"``).

    Returns:
        A dict of ``jax.Array`` / ``np.ndarray`` values, in the tree's order (``jax.ShapeDtypeStruct``
        values for an abstract tree from ``jax.eval_shape``: a listing of keys, shapes and dtypes).
    """
    result: StateDict = {}
    entries, _ = _entries(module)
    for key, leaf in entries:
        full_key = _join(prefix, key)
        if _is_layer_stack(leaf):
            for index, layer in enumerate(leaf.layers()):
                result.update(to_state_dict(layer, _join(full_key, str(index))))
        elif is_named(leaf):
            result[full_key] = leaf.array
        elif _is_array_like(leaf):
            result[full_key] = leaf
    return result


def from_state_dict(
    template: Any, state_dict: Mapping[str, Any], *, prefix: str = "", strict: bool = True
) -> Any:
    """A copy of ``template`` with every array replaced by the state dict's entry under the same key.

    Values are cast to the template's dtype and wrapped with the template's axes, so a checkpoint
    saved in bfloat16 loads into a float32 model and vice versa.

    Args:
        template: a module tree with the wanted structure, axes and dtypes (e.g. freshly initialised,
            or made with ``jax.eval_shape`` / ``eqx.filter_eval_shape`` to avoid allocating).
        state_dict: ``{dotted key: array-like}`` as produced by `to_state_dict`.
        prefix: the keys' common prefix, as given to `to_state_dict`.
        strict: when True, keys of the template missing from ``state_dict`` and keys of ``state_dict``
            the template does not have are errors; when False, missing ones keep the template's value
            and unexpected ones are ignored.

    Raises:
        KeyError: (strict) missing keys, listed.
        ValueError: (strict) unexpected keys, listed; or a value whose shape differs from the
            template's (the message names the key, both shapes and the axes).
    """
    used: set[str] = set()
    loaded = _load(template, state_dict, prefix, strict, used)
    if strict:
        unexpected = sorted(
            k for k in state_dict if k not in used and (not prefix or k.startswith(prefix + "."))
        )
        if unexpected:
            raise ValueError(
                f"from_state_dict: {len(unexpected)} unexpected key(s) the template does not have: "
                f"{_preview(unexpected)}; pass strict=False to ignore them"
            )
    return loaded


def _preview(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def _load(template: Any, state_dict: Mapping[str, Any], prefix: str, strict: bool, used: set[str]) -> Any:
    entries, treedef = _entries(template)
    missing: list[str] = []
    new_leaves = []
    for key, leaf in entries:
        full_key = _join(prefix, key)
        if _is_layer_stack(leaf):
            layers = [
                _load(layer, state_dict, _join(full_key, str(i)), strict, used)
                for i, layer in enumerate(leaf.layers())
            ]
            new_leaves.append(leaf.with_layers(layers))
        elif is_named(leaf) or _is_array_like(leaf):
            if full_key not in state_dict:
                missing.append(full_key)
                new_leaves.append(leaf)
                continue
            used.add(full_key)
            new_leaves.append(_convert(full_key, leaf, state_dict[full_key]))
        else:
            new_leaves.append(leaf)
    if missing and strict:
        raise KeyError(
            f"from_state_dict: {len(missing)} key(s) missing from the state dict: {_preview(missing)}; "
            f"pass strict=False to keep the template's values for them"
        )
    return jax.tree_util.tree_unflatten(treedef, new_leaves)


def _convert(key: str, template_leaf: Any, value: Any) -> Any:
    expected = tuple(template_leaf.array.shape if is_named(template_leaf) else template_leaf.shape)
    dtype = template_leaf.dtype
    found = tuple(np.shape(value))
    if found != expected:
        axes = f" (axes {dict(template_leaf.shape)})" if is_named(template_leaf) else ""
        raise ValueError(
            f"from_state_dict: {key!r} has shape {found} in the state dict but the template expects "
            f"{expected}{axes}"
        )
    array = jnp.asarray(value, dtype=dtype)
    return NamedArray(array, template_leaf.axes) if is_named(template_leaf) else array


def map_state_dict_keys(state_dict: Mapping[str, Any], rename: Callable[[str], str]) -> StateDict:
    """A state dict with every key passed through ``rename`` (e.g. to match another library's names).

    Raises:
        ValueError: two keys map to the same new key.
    """
    result: StateDict = {}
    for key, value in state_dict.items():
        new_key = rename(key)
        if new_key in result:
            raise ValueError(f"map_state_dict_keys: two keys map to {new_key!r} (one of them is {key!r})")
        result[new_key] = value
    return result
