"""Padded shapes for harness requests: a few bucketed lengths and a fixed row count, so the model compiles
a handful of times per evaluation instead of once per request."""

from __future__ import annotations

import math
from typing import Any

import jax

from halyard.shard import Layout, default_batch_axes, mesh_axis_sizes

SHORTEST_BUCKET = 16
"""The shortest padded length; longer buckets double up to the model's ``max_length``."""


def length_buckets(max_length: int, shortest: int = SHORTEST_BUCKET) -> list[int]:
    """The padded lengths requests are rounded up to: ``shortest, 2 * shortest, ...`` and ``max_length``.

    Args:
        max_length: the longest sequence the model is given (tokens); always the last bucket.
        shortest: the first bucket (a smaller ``max_length`` is the only bucket).

    Raises:
        ValueError: ``max_length`` below 1.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1 token, got {max_length}")
    buckets = []
    length = shortest
    while length < max_length:
        buckets.append(length)
        length *= 2
    return buckets + [max_length]


def bucket_for(length: int, buckets: list[int]) -> int:
    """The smallest bucket holding ``length`` tokens.

    Raises:
        ValueError: ``length`` exceeds the last bucket.
    """
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"{length} tokens exceed the longest bucket ({buckets[-1]})")


def batch_shards(mesh: jax.sharding.Mesh | None, layout: Layout | None) -> int:
    """How many devices a batch's rows are split over (1 without a mesh): row counts must divide by it."""
    if mesh is None:
        return 1
    sizes = mesh_axis_sizes(mesh)
    return math.prod(sizes[axis] for axis in default_batch_axes(mesh, layout))


def round_up(count: int, multiple: int) -> int:
    """``count`` rounded up to a multiple of ``multiple``."""
    return -(-count // multiple) * multiple


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive lists of ``size`` (the last may be shorter)."""
    return [items[start : start + size] for start in range(0, len(items), size)]
