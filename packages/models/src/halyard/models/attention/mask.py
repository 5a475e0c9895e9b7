"""`AttentionMask`: which keys each query may see, described rather than materialised.

A mask is a handful of small per-token arrays (segment ids, absolute positions, key validity) plus two
flags (causal, sliding window). Every attention implementation reads the same description: `reference`
materialises the full ``[pos, key_pos]`` boolean matrix with `AttentionMask.materialize`, while
`blocked` evaluates the same rule one block at a time and never builds it.

The rule, for query ``i`` and key ``j`` (positions are absolute token positions):

* causal: ``key_position[j] <= query_position[i]``;
* sliding window ``w`` (Hugging Face Mistral semantics): ``key_position[j] > query_position[i] - w``,
  so with causal the query sees exactly the ``w`` most recent positions including itself;
* segments: ``segment_ids[i] == key_segment_ids[j]`` (documents packed into one row stay apart);
* validity: ``key_valid[j]`` (padding and unfilled KV-cache slots are ``False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.named import Axis, NamedArray

_ARRAY_FIELDS = ("segment_ids", "key_segment_ids", "query_positions", "key_positions", "key_valid")


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query attends to; a pytree (arrays are leaves, the flags are static).

    Args:
        causal: a query sees only keys at positions at or before its own.
        sliding_window: if set, a query at position ``p`` sees only keys at positions ``> p - window``
            (with ``causal``: the ``window`` most recent tokens, itself included), as in transformers'
            Mistral.
        segment_ids: int ids with axes ``(batch..., "pos")``; queries see only keys of the same id.
        key_segment_ids: ids of the keys, axes ``(batch..., "key_pos")``; defaults to ``segment_ids``
            renamed to ``key_pos`` (only possible when the query and key lengths agree).
        query_positions: absolute positions of the queries ``(batch..., "pos")`` (KV-cache decoding);
            defaults to ``0, 1, ..., len(pos) - 1``.
        key_positions: absolute positions of the keys ``(batch..., "key_pos")``; defaults to ``arange``.
        key_valid: bool ``(batch..., "key_pos")``; ``False`` hides a key from every query.

    Raises:
        ValueError: ``sliding_window`` is not a positive int.
        TypeError: an array field is not a NamedArray.
    """

    causal: bool = True
    sliding_window: int | None = None
    segment_ids: NamedArray | None = None
    key_segment_ids: NamedArray | None = None
    query_positions: NamedArray | None = None
    key_positions: NamedArray | None = None
    key_valid: NamedArray | None = None

    def __post_init__(self) -> None:
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"AttentionMask.sliding_window must be a positive int or None, got {window!r}")
        for name in _ARRAY_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, NamedArray):
                raise TypeError(
                    f"AttentionMask.{name} must be a NamedArray (e.g. named(ids, ('batch', 'pos'))), "
                    f"got {type(value).__name__}"
                )

    @property
    def has_arrays(self) -> bool:
        """Whether any per-token array is set (otherwise the mask depends on lengths only)."""
        return any(getattr(self, name) is not None for name in _ARRAY_FIELDS)

    def with_key_valid(self, key_valid: NamedArray | None) -> AttentionMask:
        """A copy with ``key_valid`` replaced (handy for padding and KV caches)."""
        return _replace(self, key_valid=key_valid)

    def resolved_key_segment_ids(self, QPos: Axis, KeyPos: Axis) -> NamedArray | None:
        """``key_segment_ids``, or ``segment_ids`` renamed to the key axis when they are not given.

        Raises:
            ValueError: only ``segment_ids`` is set and the query and key lengths differ.
        """
        if self.key_segment_ids is not None or self.segment_ids is None:
            return self.key_segment_ids
        if QPos.size != KeyPos.size:
            raise ValueError(
                f"AttentionMask.segment_ids covers {QPos.name!r} (size {QPos.size}) but the keys have "
                f"{KeyPos.name!r} of size {KeyPos.size}: pass key_segment_ids as well"
            )
        return self.segment_ids.rename({QPos.name: KeyPos.name})

    def materialize(self, QPos: Axis, KeyPos: Axis) -> NamedArray:
        """The full boolean mask with axes ``(batch..., QPos, KeyPos)``: True where a query sees a key.

        Memory is quadratic in length: this is for the `reference` implementation and for tests.

        Args:
            QPos: the query position axis (``Axis("pos", num_queries)``).
            KeyPos: the key position axis (``Axis("key_pos", num_keys)``).

        Raises:
            ValueError: an array lacks the position axis it should have, or sizes disagree.
        """
        query_positions = self._positions(self.query_positions, QPos)
        key_positions = self._positions(self.key_positions, KeyPos)
        visible: NamedArray = hn.broadcast_to(True, (QPos, KeyPos))
        if self.causal:
            visible = visible & (key_positions <= query_positions)
        if self.sliding_window is not None:
            visible = visible & (key_positions > query_positions - self.sliding_window)
        if self.segment_ids is not None:
            _require_axis(self.segment_ids, QPos, "segment_ids")
            key_segments = self.resolved_key_segment_ids(QPos, KeyPos)
            assert key_segments is not None
            _require_axis(key_segments, KeyPos, "key_segment_ids")
            visible = visible & (self.segment_ids == key_segments)
        elif self.key_segment_ids is not None:
            raise ValueError("AttentionMask.key_segment_ids is set but segment_ids is not: set both")
        if self.key_valid is not None:
            _require_axis(self.key_valid, KeyPos, "key_valid")
            visible = visible & self.key_valid.astype(bool)
        return visible.rearrange(..., QPos.name, KeyPos.name)

    def _positions(self, positions: NamedArray | None, Pos: Axis) -> NamedArray:
        if positions is None:
            return NamedArray(jnp.arange(Pos.size, dtype=jnp.int32), (Pos,))
        _require_axis(positions, Pos, "query_positions" if Pos.name != "key_pos" else "key_positions")
        return positions


def _require_axis(array: NamedArray, Pos: Axis, field: str) -> None:
    if not array.has_axis(Pos.name):
        raise ValueError(
            f"AttentionMask.{field} has axes {array.axis_names} but needs the axis {Pos.name!r} "
            f"(size {Pos.size}); rename it, e.g. .rename({{'pos': {Pos.name!r}}})"
        )
    if array.axis_size(Pos.name) != Pos.size:
        raise ValueError(
            f"AttentionMask.{field} has {Pos.name!r} of size {array.axis_size(Pos.name)}, "
            f"but the attention inputs have {Pos.size}"
        )


def _replace(mask: AttentionMask, **changes: Any) -> AttentionMask:
    fields = {name: getattr(mask, name) for name in ("causal", "sliding_window", *_ARRAY_FIELDS)}
    fields.update(changes)
    return AttentionMask(**fields)


def _flatten(mask: AttentionMask) -> tuple[tuple[Any, ...], tuple[bool, int | None]]:
    return tuple(getattr(mask, name) for name in _ARRAY_FIELDS), (mask.causal, mask.sliding_window)


def _unflatten(static: tuple[bool, int | None], children: tuple[Any, ...]) -> AttentionMask:
    # JAX rebuilds trees with placeholder leaves, so skip __post_init__'s checks.
    mask = object.__new__(AttentionMask)
    object.__setattr__(mask, "causal", static[0])
    object.__setattr__(mask, "sliding_window", static[1])
    for name, child in zip(_ARRAY_FIELDS, children):
        object.__setattr__(mask, name, child)
    return mask


jax.tree_util.register_pytree_node(AttentionMask, _flatten, _unflatten)
