"""What the families report when a step collects (`halyard.named.report`; ``trainer.watch.model``).

Inside a decoder layer (stacked per layer by the layer scan, so each name ends in ``/layers``):

- ``activation/rms``: the root mean square of the layer's output (the residual stream);
- ``attention/logit_max``: the largest attention logit a query gives a key it sees (scaled, before any
  soft-cap: the value soft-capping and QK-norm exist to bound);
- ``moe/tokens_per_expert`` ``[experts]``, ``moe/dropped_tokens`` (dispatch is dropless: 0),
  ``moe/load_balancing_loss`` and ``moe/router_z_loss`` of the layer's tokens.

Outside the layers: ``logits/max``, the largest output logit over the counted tokens.

Each helper returns at once when nothing collects, so a step traced without a collector is unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models.attention.mask import AttentionMask
from halyard.named import Axis, NamedArray, collecting_reports, report

QUERY_BLOCK = 256
"""Queries per block of the attention logit maximum: its logits exist one block at a time."""
VOCAB_BLOCK = 4096
"""Vocabulary entries per block of the output logits' maximum."""


def report_rms(name: str, x: NamedArray) -> None:
    """Report the root mean square of ``x`` (float32) under ``name``."""
    if collecting_reports():
        report(name, jnp.sqrt(jnp.mean(jnp.square(x.array.astype(jnp.float32)))), reduce="rms")


def report_attention_logit_max(
    query: NamedArray, key: NamedArray, mask: AttentionMask, scale: float | None
) -> None:
    """Report ``attention/logit_max``: the largest ``scale * q . k`` over the (query, key) pairs ``mask`` lets
    attend, computed a block of `QUERY_BLOCK` queries at a time (memory linear in the sequence).

    Args:
        query: ``(batch..., pos, heads, head_size)``; key: ``(batch..., key_pos, kv_heads, head_size)``.
        mask: the layer's attention mask.
        scale: the logit multiplier (None: ``1/sqrt(head_size)``, as `attention` takes it).
    """
    if not collecting_reports():
        return
    scale = 1.0 / math.sqrt(query.axis_size("head_size")) if scale is None else scale
    Pos, KeyPos = query.axis("pos"), key.axis("key_pos")
    kv_heads = key.axis_size("kv_heads")
    grouped = hn.unflatten_axis(
        query, "heads", (Axis("kv_heads", kv_heads), Axis("group", query.axis_size("heads") // kv_heads))
    )
    # The query side of the mask is cut into blocks below; the key side stays whole.
    positions = mask.query_positions
    if positions is None:
        positions = NamedArray(jnp.arange(Pos.size, dtype=jnp.int32), (Pos,))
    mask = dataclasses.replace(mask, key_segment_ids=mask.resolved_key_segment_ids(Pos, KeyPos))
    block = max(size for size in range(1, min(QUERY_BLOCK, Pos.size) + 1) if Pos.size % size == 0)

    def block_max(start: jax.Array) -> jax.Array:
        def cut(x: NamedArray | None) -> NamedArray | None:
            return None if x is None else hn.dynamic_slice(x, "pos", start, block)

        block_mask = dataclasses.replace(
            mask, query_positions=cut(positions), segment_ids=cut(mask.segment_ids)
        )
        q = cut(grouped)
        assert q is not None
        logits = hn.dot(q, key, axis="head_size", preferred_element_type=jnp.float32) * scale
        visible = block_mask.materialize(q.axis("pos"), KeyPos)
        return jnp.max(hn.where(visible, logits, -jnp.inf).array)

    starts = jnp.arange(0, Pos.size, block, dtype=jnp.int32)
    report("attention/logit_max", jnp.max(jax.lax.map(block_max, starts)), reduce="max")


def report_logits_max(hidden: NamedArray, unembedding: NamedArray, token_mask: NamedArray | None) -> None:
    """Report ``logits/max``: the largest output logit ``hidden . unembedding`` over the tokens ``token_mask``
    counts (every token without one), a block of `VOCAB_BLOCK` vocabulary entries at a time.

    Args:
        hidden: final hidden states ``(batch..., pos, embed)``.
        unembedding: ``(vocab, embed)``.
        token_mask: 0/1 ``(batch..., pos)``, or None.
    """
    if not collecting_reports():
        return
    weight = unembedding.rearrange("vocab", "embed").array.astype(hidden.dtype)
    vocab = weight.shape[0]
    block = min(VOCAB_BLOCK, vocab)
    weight = jnp.pad(weight, ((0, -vocab % block), (0, 0)))
    blocks = weight.reshape(-1, block, weight.shape[1])
    tokens = hidden.rearrange(..., "embed")
    flat = tokens.array.reshape(-1, tokens.array.shape[-1])
    counted = jnp.ones(flat.shape[0], bool)
    if token_mask is not None:
        counted = hn.broadcast_to(token_mask, tokens.axes[:-1]).array.reshape(-1) > 0

    def block_max(index: jax.Array) -> jax.Array:
        logits = jnp.einsum("te,ve->tv", flat, blocks[index], preferred_element_type=jnp.float32)
        real = index * block + jnp.arange(block) < vocab  # the padded rows are not logits
        return jnp.max(jnp.where(counted[:, None] & real[None, :], logits, -jnp.inf))

    report("logits/max", jnp.max(jax.lax.map(block_max, jnp.arange(blocks.shape[0]))), reduce="max")
