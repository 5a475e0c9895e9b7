"""A small transformer-shaped parameter tree shared by the layout tests (not collected by pytest)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from halyard.named import Axis, NamedArray

Vocab = Axis("vocab", 64)
Embed = Axis("embed", 32)
Heads = Axis("heads", 4)
KvHeads = Axis("kv_heads", 2)
HeadSize = Axis("head_size", 8)
Mlp = Axis("mlp", 128)
Layers = Axis("layers", 2)
Experts = Axis("experts", 4)

SHAPES: dict[str, tuple[Axis, ...]] = {
    "token_embedding": (Vocab, Embed),
    "blocks.attn.q": (Layers, Embed, Heads, HeadSize),
    "blocks.attn.k": (Layers, Embed, KvHeads, HeadSize),
    "blocks.attn.o": (Layers, Heads, HeadSize, Embed),
    "blocks.mlp.w_in": (Layers, Embed, Mlp),
    "blocks.mlp.w_out": (Layers, Mlp, Embed),
    "blocks.moe.w_in": (Layers, Experts, Embed, Mlp),
    "blocks.norm": (Layers, Embed),
    "final_norm": (Embed,),
    "lm_head": (Embed, Vocab),
}
MIN_SHARD = 100  # the norms (64 and 32 elements) stay replicated


def _nest(flat: dict) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def init_tree(scale: jax.Array) -> dict:
    """Deterministic weights with the shapes above (nested dicts, dotted paths as in `SHAPES`).

    Values are ``scale * sin(i + offset)`` over the flat index (cheap to compile, unlike random bits);
    every leaf differs.
    """
    flat = {}
    for offset, (path, axes) in enumerate(SHAPES.items()):
        shape = tuple(a.size for a in axes)
        values = jnp.sin(jnp.arange(math.prod(shape), dtype=jnp.float32) + 10.0 * offset).reshape(shape)
        flat[path] = NamedArray(scale * values, axes)
    return _nest(flat)


def flatten(tree: dict, prefix: str = "") -> dict:
    """Dotted path -> leaf (NamedArrays kept whole)."""
    flat = {}
    for name, value in tree.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat
