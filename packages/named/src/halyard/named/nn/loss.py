"""Cross-entropy and z-loss over a named vocabulary axis (computed in float32)."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from halyard.named.axis import AxisSelector, axis_name, format_axes
from halyard.named.broadcast import broadcast_to
from halyard.named.core import NamedArray

Reduction = Literal["mean", "sum", "none"]


def _reduce(per_token: NamedArray, where: NamedArray | None, reduction: Reduction) -> NamedArray:
    if where is not None:
        if where.dtype != jnp.bool_:
            raise TypeError(f"where must be a boolean NamedArray (True = counts), got dtype {where.dtype}")
        weights = broadcast_to(where, per_token.axes).array
        per_token = NamedArray(jnp.where(weights, per_token.array, 0.0), per_token.axes)
    if reduction == "none":
        return per_token
    total = jnp.sum(per_token.array)
    if reduction == "sum":
        return NamedArray(total, ())
    if reduction == "mean":
        count = per_token.size if where is None else jnp.sum(weights)
        # An all-masked batch gives 0, not NaN: such batches occur at the end of packed data.
        return NamedArray(total / jnp.maximum(count, 1), ())
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_where(where: NamedArray | None, per_token: NamedArray) -> None:
    if where is not None:
        for axis in where.axes:
            if not per_token.has_axis(axis.name):
                raise ValueError(
                    f"where {format_axes(where.axes)} has axis {axis.name!r} which the per-token loss "
                    f"{format_axes(per_token.axes)} lacks"
                )


def cross_entropy_loss(
    logits: NamedArray,
    labels: NamedArray,
    Vocab: AxisSelector,
    *,
    where: NamedArray | None = None,
    reduction: Reduction = "mean",
) -> NamedArray:
    """``logsumexp(logits) - logits[label]`` per token, reduced.

    Args:
        logits: float NamedArray with the ``Vocab`` axis, e.g. ``(batch, pos, vocab)``.
        labels: either integer class ids with the logits' other axes (e.g. ``(batch, pos)``), or
            float target probabilities with the ``Vocab`` axis (soft / one-hot labels).
        Vocab: the vocabulary axis (name or Axis).
        where: boolean NamedArray over (some of) the per-token axes; False entries contribute 0 and
            are not counted by ``"mean"``.
        reduction: ``"mean"`` over counted tokens (0 when none counts), ``"sum"``, or ``"none"``
            (the per-token loss with the logits' axes minus ``Vocab``).

    Returns:
        A scalar NamedArray (mean / sum) or the per-token loss, in float32.

    Raises:
        KeyError: ``logits`` has no ``Vocab`` axis.
        ValueError: integer labels whose axes differ from the logits' non-vocab axes.
    """
    vocab = axis_name(Vocab)
    vocab_index = logits.axis_index(Vocab)
    logits32 = logits.astype(jnp.float32)
    log_normaliser = jax.nn.logsumexp(logits32.array, axis=vocab_index)
    token_axes = tuple(a for a in logits.axes if a.name != vocab)
    if jnp.issubdtype(labels.dtype, jnp.integer):
        if sorted(labels.axis_names) != sorted(a.name for a in token_axes):
            raise ValueError(
                f"cross_entropy_loss: integer labels {format_axes(labels.axes)} must have exactly the "
                f"logits' axes without {vocab!r}: {format_axes(token_axes)}"
            )
        ids = broadcast_to(labels, token_axes).array
        moved = jnp.moveaxis(logits32.array, vocab_index, -1)
        picked = jnp.take_along_axis(moved, ids[..., None], axis=-1)[..., 0]
        per_token = NamedArray(log_normaliser - picked, token_axes)
    else:
        targets = broadcast_to(labels.astype(jnp.float32), logits.axes).array
        expected_logit = jnp.sum(targets * logits32.array, axis=vocab_index)
        total_mass = jnp.sum(targets, axis=vocab_index)
        per_token = NamedArray(total_mass * log_normaliser - expected_logit, token_axes)
    _check_where(where, per_token)
    return _reduce(per_token, where, reduction)


def z_loss(
    logits: NamedArray,
    Vocab: AxisSelector,
    *,
    where: NamedArray | None = None,
    reduction: Reduction = "mean",
) -> NamedArray:
    """``logsumexp(logits)**2`` per token (PaLM's auxiliary loss; multiply by e.g. 1e-4 yourself).

    Args and raises as in `cross_entropy_loss`.
    """
    vocab_index = logits.axis_index(Vocab)
    log_normaliser = jax.nn.logsumexp(logits.astype(jnp.float32).array, axis=vocab_index)
    token_axes = tuple(a for a in logits.axes if a.name != axis_name(Vocab))
    per_token = NamedArray(jnp.square(log_normaliser), token_axes)
    _check_where(where, per_token)
    return _reduce(per_token, where, reduction)
