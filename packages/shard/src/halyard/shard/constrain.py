"""Activation sharding from model code: `use_layout` makes a (layout, mesh) active, `constrain` applies it.

Why a context manager: model code deep in the stack (an attention block inside a scanned layer) should
name logical axes only and never thread a mesh and a layout through every call. `use_layout` is the one
mechanism that makes a layout active: it is entered and left in one visible place, nests, and is private
to the thread that entered it. Without an active layout `constrain` returns its argument unchanged, so
the same model code runs on one device untouched.

The state is a `jax.make_user_context` value rather than a plain `contextvars.ContextVar`: the active
layout is read while a function is traced, and a user context is part of ``jax.jit``'s cache key, so a
jitted function called under another layout is traced again instead of silently reusing the constraints
of the first (a plain context variable would hit the cache and keep the old layout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding

from halyard.named import NamedArray
from halyard.shard.layout import Layout


@dataclass(frozen=True)
class ActiveLayout:
    """The layout and mesh `constrain` uses."""

    layout: Layout
    mesh: jax.sharding.Mesh


# Holds an ActiveLayout (hashable: it becomes part of jit's cache key) or None.
_ACTIVE = jax.make_user_context(default_value=None)


@contextlib.contextmanager
def use_layout(layout: Layout, mesh: jax.sharding.Mesh) -> Iterator[ActiveLayout]:
    """Make ``layout`` on ``mesh`` the active layout for `constrain` inside the ``with`` block.

    Nested blocks override and restore the outer one on exit (also on exceptions).

    Args:
        layout: the rules for activations (``min_shard`` does not apply to activations).
        mesh: the mesh the constraints refer to.

    Raises:
        TypeError: when ``layout`` is not a `Layout` or ``mesh`` is not a ``jax.sharding.Mesh``.
    """
    if not isinstance(layout, Layout):
        raise TypeError(f"use_layout needs a halyard.shard.Layout, got {type(layout).__name__}")
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"use_layout needs a jax.sharding.Mesh (MeshSpec(...).build()), got {type(mesh).__name__}"
        )
    active = ActiveLayout(layout, mesh)
    with _ACTIVE(active):
        yield active


@contextlib.contextmanager
def without_layout() -> Iterator[None]:
    """Make no layout active inside the ``with`` block: `constrain` returns its argument unchanged.

    For code traced per device (inside ``jax.shard_map``), where a constraint naming mesh axes has no
    meaning: the arrays there are already one device's.
    """
    with _ACTIVE(None):
        yield


def active_layout() -> ActiveLayout | None:
    """The layout and mesh made active by the innermost `use_layout`, or ``None``."""
    return _ACTIVE.value


def constrain(x: NamedArray) -> NamedArray:
    """Constrain an activation to the active layout's placement (``jax.lax.with_sharding_constraint``).

    A no-op (returns ``x``) when no layout is active.

    Args:
        x: a named activation, e.g. axes ``(batch, pos, embed)``.

    Raises:
        TypeError: when ``x`` is not a `NamedArray` (plain arrays carry no names to place by).
    """
    if not isinstance(x, NamedArray):
        raise TypeError(f"constrain takes a NamedArray (it places axes by name), got {type(x).__name__}")
    active = _ACTIVE.value
    if active is None:
        return x
    spec = active.layout.partition_spec(x, active.mesh)
    array = jax.lax.with_sharding_constraint(x.array, NamedSharding(active.mesh, spec))
    return NamedArray(array, x.axes)
