"""Attention masks as boolean NamedArrays over ``(pos, key_pos)`` (True = may attend).

Masks compose with ``&`` and ``|`` by name, so a Mistral-style mask for packed documents is
``causal_mask(Pos, KeyPos) & sliding_window_mask(Pos, KeyPos, 4096) & segment_mask(seg_q, seg_k)``,
and a batch axis carried by the segment ids broadcasts in.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from halyard.named.axis import Axis, AxisSelector, axis_name, format_axes
from halyard.named.core import NamedArray


def _check_position_axes(QPos: Axis, KPos: Axis, what: str) -> None:
    if not isinstance(QPos, Axis) or not isinstance(KPos, Axis):
        raise TypeError(
            f"{what} needs Axis objects with sizes, e.g. Axis('pos', 128), got {QPos!r}, {KPos!r}"
        )
    if QPos.name == KPos.name:
        raise ValueError(
            f"{what}: query and key position axes are both called {QPos.name!r}; give the keys their own "
            f"name, e.g. {QPos.alias('key_' + QPos.name)!r}"
        )


def _offsets(QPos: Axis, KPos: Axis, q_start: Any, k_start: Any) -> NamedArray:
    """``q - k`` for every (query, key) pair, with absolute positions ``start + index``."""
    q = jnp.arange(QPos.size) + q_start
    k = jnp.arange(KPos.size) + k_start
    return NamedArray(q[:, None] - k[None, :], (QPos, KPos))


def causal_mask(QPos: Axis, KPos: Axis, *, q_start: Any = 0, k_start: Any = 0) -> NamedArray:
    """Queries see keys at their own position or earlier.

    Args:
        QPos: query position axis, e.g. ``Axis("pos", 128)``.
        KPos: key position axis, e.g. ``Axis("key_pos", 128)`` (a different name).
        q_start, k_start: absolute position of the first query / key (ints or traced scalars), e.g.
            ``q_start=cache_length`` when decoding with a KV cache.

    Returns:
        bool NamedArray ``(QPos, KPos)``: ``k <= q``.

    Raises:
        ValueError: both axes share a name.
    """
    _check_position_axes(QPos, KPos, "causal_mask")
    offsets = _offsets(QPos, KPos, q_start, k_start)
    return NamedArray(offsets.array >= 0, offsets.axes)


def sliding_window_mask(
    QPos: Axis, KPos: Axis, window: int, *, q_start: Any = 0, k_start: Any = 0
) -> NamedArray:
    """Queries see only the ``window`` most recent positions: ``q - k < window``.

    This is the window bound alone (it does not hide future keys); combine it with `causal_mask`
    for causal local attention (Mistral): ``causal_mask(P, K) & sliding_window_mask(P, K, w)``.

    Args:
        QPos, KPos: query and key position axes (different names).
        window: number of positions a query sees, itself included (>= 1).
        q_start, k_start: absolute positions of the first query / key, as in `causal_mask`.

    Raises:
        ValueError: ``window < 1``, or both axes share a name.
    """
    _check_position_axes(QPos, KPos, "sliding_window_mask")
    if window < 1:
        raise ValueError(f"sliding_window_mask: window must be at least 1, got {window}")
    offsets = _offsets(QPos, KPos, q_start, k_start)
    return NamedArray(offsets.array < window, offsets.axes)


def segment_mask(
    q_segments: NamedArray,
    k_segments: NamedArray | None = None,
    *,
    QPos: AxisSelector = "pos",
    KPos: AxisSelector = "key_pos",
) -> NamedArray:
    """Tokens attend only within their own segment (document) when sequences are packed.

    Args:
        q_segments: integer segment ids of the queries, e.g. axes ``(batch, pos)``.
        k_segments: segment ids of the keys, e.g. ``(batch, key_pos)``; default: ``q_segments`` with
            ``QPos`` renamed to ``KPos`` (self-attention).
        QPos, KPos: position axis names used for that default.

    Returns:
        bool NamedArray with the union of both arrays' axes: True where the ids are equal.

    Raises:
        ValueError: the two arrays have the same axis names (the key positions need their own name).
    """
    if k_segments is None:
        k_segments = q_segments.rename({axis_name(QPos): axis_name(KPos)})
    if set(q_segments.axis_names) == set(k_segments.axis_names):
        raise ValueError(
            f"segment_mask: query ids {format_axes(q_segments.axes)} and key ids {format_axes(k_segments.axes)} "
            f"have the same axes, so the comparison would be elementwise; rename the key positions, "
            f"e.g. k_segments.rename({{'pos': 'key_pos'}})"
        )
    return q_segments == k_segments
