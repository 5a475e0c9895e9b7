"""Context parallelism: attention over a sequence split across devices (the ``sequence`` mesh axis).

When the active layout (`halyard.shard.use_layout`) splits the queries' ``pos`` axis over mesh axes of
more than one device, `attention` runs one of three explicit implementations inside ``shard_map``, each
device holding its share of the queries, keys and values (``N`` devices along the sequence):

- ``all_gather``: keys and values (and their mask arrays) are all-gathered over the sequence; each device
  attends its own queries over every key. Communication: ``2 (N-1)/N`` of K/V per layer forward (a
  reduce-scatter of their gradients backward); memory: one full K/V per device. Cheapest with few KV
  heads (grouped-query attention).
- ``ring``: each device keeps its queries and passes K/V chunks around the ring (``ppermute``), folding
  each chunk into its output with the log-sum-exp rescaling of the online softmax; the permute of the
  next chunk is issued before this chunk's compute, so it can overlap. The backward pass walks the ring
  again, the key and value gradients travelling with their chunk. Memory: two K/V chunks per device.
- ``ulysses``: an all-to-all turns sequence-split queries, keys and values into head-split ones over
  the whole sequence, attention runs locally, and a second all-to-all turns the output back. Needs the
  heads and KV heads (on each device, after tensor parallelism) to divide by ``N``.

``auto`` picks ``ulysses`` where the heads divide, else ``all_gather``. Every implementation runs the
blocked kernel on its share with the mask evaluated from absolute positions, so causal, sliding-window,
segment (packed documents) and key-validity masks, logit soft-caps and grouped-query attention all hold,
and any order of the positions works (the load-balanced order of `halyard.models.context_order`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from halyard.models.attention.blocked import blocked_attention, blocked_backward, blocked_forward
from halyard.models.attention.layout import HEADS, KV_HEADS, POS, FlatAttention
from halyard.named import NamedArray
from halyard.shard import active_layout

CONTEXT_PARALLEL = ("auto", "ring", "all_gather", "ulysses")
"""Values of `attention`'s ``context_parallel`` (and the models' ``context_parallel`` key)."""


@dataclass(frozen=True)
class ContextSplit:
    """How the active layout splits one attention's inputs.

    Attributes:
        mesh: the mesh.
        sequence: mesh axes the ``pos`` axis is split over (``("sequence",)``).
        size: devices along them.
        batch: mesh axes of the (flattened) batch dimension.
        heads: mesh axes of both head dimensions (tensor parallelism), or ``()``.
    """

    mesh: jax.sharding.Mesh
    sequence: tuple[str, ...]
    size: int
    batch: tuple[str, ...]
    heads: tuple[str, ...]


def context_split(query: NamedArray, key: NamedArray) -> ContextSplit | None:
    """The split of self-attention inputs whose ``pos`` the active layout puts on several devices, else
    None (no active layout, ``pos`` not split, or keys of another length: a KV cache)."""
    split = layout_split(query, key)
    return split if split is not None and split.size > 1 else None


def layout_split(query: NamedArray, key: NamedArray) -> ContextSplit | None:
    """How the active layout places self-attention inputs (``size`` 1 when ``pos`` is not split), or None
    (no active layout, or keys of another length: a KV cache)."""
    active = active_layout()
    if active is None or query.axis_size(POS) != key.axis_size("key_pos"):
        return None
    query_dims = {d.axis.name: d.mesh_axes for d in active.layout.placement(query.axes, active.mesh)}
    sequence = query_dims[POS]
    sizes = dict(active.mesh.shape)
    size = math.prod(sizes[a] for a in sequence)
    key_dims = {d.axis.name: d.mesh_axes for d in active.layout.placement(key.axes, active.mesh)}
    heads = query_dims[HEADS] if query_dims[HEADS] == key_dims[KV_HEADS] else ()
    batch = tuple(
        a for axis in query.axes if axis.name not in (POS, HEADS, "head_size") for a in query_dims[axis.name]
    )
    return ContextSplit(active.mesh, tuple(sequence), size, batch, tuple(heads))


def choose_context_parallel(flat: FlatAttention, split: ContextSplit) -> str:
    """``ulysses`` when each device's heads and KV heads divide by the sequence split, else ``all_gather``."""
    return "ulysses" if ulysses_unsupported_reason(flat, split) is None else "all_gather"


def ulysses_unsupported_reason(flat: FlatAttention, split: ContextSplit) -> str | None:
    """Why ``ulysses`` cannot split these heads over the sequence devices, or None."""
    head_split = math.prod(dict(split.mesh.shape)[a] for a in split.heads)
    heads, kv_heads = flat.query.shape[2] // head_split, flat.key.shape[2] // head_split
    if heads % split.size or kv_heads % split.size:
        return (
            f"ulysses needs the heads ({heads}) and kv_heads ({kv_heads}) of each device to divide by the "
            f"{split.size} devices of the sequence axis"
        )
    return None


def context_parallel_attention(
    flat: FlatAttention,
    split: ContextSplit,
    *,
    implementation: str,
    scale: float,
    block_size: int,
    logit_softcap: float | None,
) -> jax.Array:
    """``[batch, pos, heads, head_size]`` attention of ``flat`` computed with ``implementation`` (one of
    `CONTEXT_PARALLEL`) over ``split``.

    Raises:
        ValueError: an unknown implementation, or ``ulysses`` where the heads do not divide.
    """
    if implementation not in CONTEXT_PARALLEL:
        raise ValueError(
            f"attention: unknown context_parallel {implementation!r}; choose one of {CONTEXT_PARALLEL}"
        )
    if implementation == "auto":
        implementation = choose_context_parallel(flat, split)
    if implementation == "ulysses" and (reason := ulysses_unsupported_reason(flat, split)) is not None:
        raise ValueError(f"attention: context_parallel=ulysses: {reason}; use ring or all_gather")
    kernel = {"ring": _ring, "all_gather": _all_gather, "ulysses": _ulysses}[implementation]
    settings = _Settings(
        axis=split.sequence,
        size=split.size,
        causal=flat.causal,
        sliding_window=flat.sliding_window,
        default_positions=flat.default_positions,
        scale=float(scale),
        block_size=block_size,
        logit_softcap=logit_softcap,
    )
    batch = split.batch or None
    sequence = split.sequence
    heads = split.heads or None
    array_spec = PartitionSpec(batch, sequence, heads, None)
    token_spec = PartitionSpec(batch, sequence)
    query_segments, key_segments = flat.query_segments, flat.key_segments
    if query_segments is None or key_segments is None:
        query_segments, key_segments = (
            jnp.zeros_like(flat.query_positions),
            jnp.zeros_like(flat.key_positions),
        )
    key_valid = flat.key_valid if flat.key_valid is not None else jnp.ones(flat.key_positions.shape, bool)
    sharded = jax.shard_map(
        partial(kernel, settings),
        mesh=split.mesh,
        in_specs=(array_spec, array_spec, array_spec, *([token_spec] * 5)),
        out_specs=array_spec,
        # The blocked kernel's initial states are created inside (not varying over the mesh) and meet
        # device-varying values in its loops; the collectives here are explicit, so the check adds nothing.
        check_vma=False,
    )
    return sharded(
        flat.query,
        flat.key,
        flat.value,
        flat.query_positions,
        query_segments.astype(jnp.int32),
        flat.key_positions,
        key_segments.astype(jnp.int32),
        key_valid,
    )


@dataclass(frozen=True)
class _Settings:
    axis: tuple[str, ...]
    size: int
    causal: bool
    sliding_window: int | None
    default_positions: bool
    scale: float
    block_size: int
    logit_softcap: float | None

    def flat(self, query, key, value, query_tokens, key_tokens, *, default_positions=False) -> FlatAttention:  # type: ignore[no-untyped-def]
        """A device's problem: its queries against these keys (mask from the given absolute positions)."""
        return FlatAttention(
            query=query,
            key=key,
            value=value,
            query_positions=query_tokens[0],
            query_segments=query_tokens[1],
            key_positions=key_tokens[0],
            key_segments=key_tokens[1],
            key_valid=key_tokens[2],
            causal=self.causal,
            sliding_window=self.sliding_window,
            default_positions=default_positions,
            batch_axes=(),
            query_axes=(),
        )

    @property
    def kernel(self) -> dict:
        return {"scale": self.scale, "block_size": self.block_size, "logit_softcap": self.logit_softcap}


def _gather(settings: _Settings, array: jax.Array) -> jax.Array:
    return jax.lax.all_gather(array, settings.axis, axis=1, tiled=True)


def _all_gather(settings: _Settings, query, key, value, *tokens) -> jax.Array:  # type: ignore[no-untyped-def]
    query_tokens, key_tokens = tokens[:2], tuple(_gather(settings, t) for t in tokens[2:])
    flat = settings.flat(query, _gather(settings, key), _gather(settings, value), query_tokens, key_tokens)
    return blocked_attention(flat, **settings.kernel)


def _ulysses(settings: _Settings, query, key, value, *tokens) -> jax.Array:  # type: ignore[no-untyped-def]
    def to_heads(array: jax.Array) -> jax.Array:  # [B, S/N, H, d] -> [B, S, H/N, d]
        return jax.lax.all_to_all(array, settings.axis, split_axis=2, concat_axis=1, tiled=True)

    gathered = tuple(_gather(settings, t) for t in tokens)
    flat = settings.flat(
        to_heads(query),
        to_heads(key),
        to_heads(value),
        gathered[:2],
        gathered[2:],
        default_positions=settings.default_positions,  # the gathered positions are 0, 1, ... again
    )
    output = blocked_attention(flat, **settings.kernel)
    return jax.lax.all_to_all(output, settings.axis, split_axis=1, concat_axis=2, tiled=True)


def _ring(settings: _Settings, query, key, value, *tokens) -> jax.Array:  # type: ignore[no-untyped-def]
    return _ring_attention(settings, query, key, value, tokens[:2], tokens[2:])


def _rotate(settings: _Settings, tree):  # type: ignore[no-untyped-def]
    """Each device's ``tree`` to the next device along the sequence (the last to the first)."""
    ring = [(i, (i + 1) % settings.size) for i in range(settings.size)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, settings.axis, ring), tree)


def _merge(
    output: jax.Array, log_sum_exp: jax.Array, chunk_output: jax.Array, chunk_log_sum_exp: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Two partial attentions of the same queries over disjoint keys as one (log-sum-exp ``-inf``: no key)."""
    top = jnp.maximum(log_sum_exp, chunk_log_sum_exp)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weight, chunk_weight = jnp.exp(log_sum_exp - top), jnp.exp(chunk_log_sum_exp - top)
    total = weight + chunk_weight
    seen = total > 0
    merged = (output * weight[..., None] + chunk_output * chunk_weight[..., None]) / jnp.where(
        seen, total, 1.0
    )[..., None]
    return merged, jnp.where(seen, top + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring_attention(settings: _Settings, query, key, value, query_tokens, key_tokens) -> jax.Array:  # type: ignore[no-untyped-def]
    return _ring_forward(settings, query, key, value, query_tokens, key_tokens)[0]


def _ring_forward(settings: _Settings, query, key, value, query_tokens, key_tokens):  # type: ignore[no-untyped-def]
    output = jnp.zeros(query.shape, jnp.float32)
    log_sum_exp = jnp.full(query.shape[:-1], -jnp.inf, jnp.float32)
    chunk = (key, value, key_tokens)
    for step in range(settings.size):
        following = _rotate(settings, chunk) if step < settings.size - 1 else None  # before the compute
        flat = settings.flat(query, chunk[0], chunk[1], query_tokens, chunk[2])
        chunk_output, chunk_log_sum_exp = blocked_forward(flat, **settings.kernel)
        chunk_log_sum_exp = jnp.where(jnp.isposinf(chunk_log_sum_exp), -jnp.inf, chunk_log_sum_exp)
        output, log_sum_exp = _merge(output, log_sum_exp, chunk_output, chunk_log_sum_exp)
        chunk = following  # type: ignore[assignment]
    log_sum_exp = jnp.where(jnp.isneginf(log_sum_exp), jnp.inf, log_sum_exp)  # the blocked kernel's "no key"
    output = output.astype(query.dtype)
    return output, (query, key, value, query_tokens, key_tokens, output, log_sum_exp)


def _ring_backward(settings: _Settings, residuals, output_cotangent):  # type: ignore[no-untyped-def]
    query, key, value, query_tokens, key_tokens, output, log_sum_exp = residuals
    query_gradient = jnp.zeros(query.shape, jnp.float32)
    chunk = (key, value, key_tokens)
    gradients = (jnp.zeros(key.shape, jnp.float32), jnp.zeros(value.shape, jnp.float32))
    for step in range(settings.size):
        flat = settings.flat(query, chunk[0], chunk[1], query_tokens, chunk[2])
        partial_query, partial_key, partial_value = blocked_backward(
            flat, output, log_sum_exp, output_cotangent, **settings.kernel
        )
        query_gradient = query_gradient + partial_query
        gradients = (gradients[0] + partial_key, gradients[1] + partial_value)
        if step < settings.size - 1:
            chunk, gradients = _rotate(settings, (chunk, gradients))
    key_gradient, value_gradient = _rotate(settings, gradients)  # the N-th move brings them home
    integer_zero = jax.tree.map(lambda _: None, (query_tokens, key_tokens))
    return (
        query_gradient.astype(query.dtype),
        key_gradient.astype(key.dtype),
        value_gradient.astype(value.dtype),
        *integer_zero,
    )


_ring_attention.defvjp(_ring_forward, _ring_backward)
