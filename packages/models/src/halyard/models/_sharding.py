"""Activation sharding constraints: `halyard.shard.constrain` (a no-op without an active layout)."""

from __future__ import annotations

from halyard.named import NamedArray

try:
    from halyard.shard import constrain as _shard_constrain
except ImportError:  # halyard.shard is landing in parallel; until then constraints are no-ops
    _shard_constrain = None


def constrain(x: NamedArray) -> NamedArray:
    """Pin ``x`` to the active layout's sharding for its axis names (identity when none is active)."""
    return x if _shard_constrain is None else _shard_constrain(x)
