"""`LmBatch`: how a language-model batch reaches a model (inputs, labels, positions, segments, loss mask).

The data loader yields ``tokens[B, S+1]`` and ``segment_ids[B, S+1]`` (int32; a segment is a document
packed into the window). `LmBatch.from_tokens` turns them into the model's view:

- ``tokens = tokens[:, :-1]`` and ``labels = tokens[:, 1:]`` (axes ``batch``, ``pos`` of size S);
- ``positions`` restart at 0 at the start of every segment, so a document packed in the middle of a
  window gets the positions (and therefore the logits) it would get alone;
- attention stays within a segment (``segment_ids`` go into the `AttentionMask`);
- ``loss_mask`` is 0 where the label lies in another segment than the input token (no prediction across
  a document boundary), times the optional per-token ``loss_mask[B, S+1]`` of the loader read at the
  label's position (mask 0 on padding and prompt tokens that must not be trained on).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named import NamedArray, named

BATCH = "batch"
POS = "pos"


def _raw_2d(x: Any, what: str) -> jax.Array:
    if isinstance(x, NamedArray):
        x = x.unwrap(BATCH, POS) if x.ndim == 2 else x.array
    array = jnp.asarray(x)
    if array.ndim != 2:
        raise ValueError(
            f"LmBatch {what} must have shape [batch, seq_len + 1], got shape {tuple(array.shape)}"
        )
    return array


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Positions that restart at 0 whenever the segment id changes along the last dimension.

    Args:
        segment_ids: integer array ``[..., pos]``; a segment is a run of equal ids.

    Returns:
        int32 array of the same shape: the index of each token within its run.
    """
    length = segment_ids.shape[-1]
    index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones(segment_ids.shape[:-1] + (1,), bool), segment_ids[..., 1:] != segment_ids[..., :-1]],
        axis=-1,
    )
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=segment_ids.ndim - 1)
    return index - start_index


class LmBatch(eqx.Module):
    """One next-token-prediction batch, every field a NamedArray over ``(batch, pos)``.

    Attributes:
        tokens: input token ids, int32.
        labels: the token to predict at each position, int32.
        positions: position of each input token within its document, int32.
        loss_mask: float32 weight of each position in the loss (0 or 1).
        segment_ids: document id of each input token (attention stays within one), or None.
    """

    tokens: NamedArray
    labels: NamedArray
    positions: NamedArray
    loss_mask: NamedArray
    segment_ids: NamedArray | None

    @classmethod
    def from_tokens(cls, tokens: Any, segment_ids: Any = None, loss_mask: Any = None) -> LmBatch:
        """Build a batch from the loader's windows of ``seq_len + 1`` tokens (convention in the module doc).

        Works on numpy or JAX arrays, inside or outside ``jit``.

        Args:
            tokens: int ``[batch, seq_len + 1]``.
            segment_ids: int ``[batch, seq_len + 1]`` document ids, or None (one document per row).
            loss_mask: ``[batch, seq_len + 1]`` 0/1 per token (is this token a training target?), or None.

        Raises:
            ValueError: a shape is not 2-D or the shapes disagree, or the window is shorter than 2 tokens.
        """
        raw_tokens = _raw_2d(tokens, "tokens").astype(jnp.int32)
        if raw_tokens.shape[1] < 2:
            raise ValueError(
                f"LmBatch tokens need at least 2 tokens per row (inputs and labels), got {raw_tokens.shape}"
            )
        mask = jnp.ones(raw_tokens[:, 1:].shape, jnp.float32)
        if loss_mask is not None:
            raw_mask = _raw_2d(loss_mask, "loss_mask")
            if raw_mask.shape != raw_tokens.shape:
                raise ValueError(
                    f"LmBatch loss_mask shape {raw_mask.shape} differs from tokens shape {raw_tokens.shape}"
                )
            mask = mask * raw_mask[:, 1:].astype(jnp.float32)
        axes = (BATCH, POS)
        if segment_ids is None:
            positions = jnp.broadcast_to(jnp.arange(raw_tokens.shape[1] - 1, dtype=jnp.int32), mask.shape)
            segments = None
        else:
            raw_segments = _raw_2d(segment_ids, "segment_ids").astype(jnp.int32)
            if raw_segments.shape != raw_tokens.shape:
                raise ValueError(
                    f"LmBatch segment_ids shape {raw_segments.shape} differs from tokens shape {raw_tokens.shape}"
                )
            mask = mask * (raw_segments[:, 1:] == raw_segments[:, :-1]).astype(jnp.float32)
            positions = segment_positions(raw_segments[:, :-1])
            segments = named(raw_segments[:, :-1], axes)
        return cls(
            tokens=named(raw_tokens[:, :-1], axes),
            labels=named(raw_tokens[:, 1:], axes),
            positions=named(positions, axes),
            loss_mask=named(mask, axes),
            segment_ids=segments,
        )
