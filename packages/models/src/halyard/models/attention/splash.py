"""Attention through JAX's Pallas splash-attention kernel (TPU; Pallas's interpret mode elsewhere).

Splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) is a flash-attention kernel for
TPU that skips the blocks a static mask hides (the causal upper triangle, outside a sliding window) and
reads the dynamic per-token rules (segment ids: packed documents) block by block. Grouped-query attention
runs natively: each query head reads its kv head through the kernel's index map, no kv head is repeated.
Logit soft-capping (Gemma 2/3) is the kernel's ``attn_logits_soft_cap``. The backward pass is the kernel's
own pair of Pallas kernels (dK/dV, then dQ), recomputing each block from the saved log-sum-exp.

What it takes: self-attention with the default positions (``0, 1, ...`` for queries and keys: training and
prefill), causal or not, an optional sliding window, optional segment ids. What it refuses (one line naming
the field, `splash_unsupported_reason`): explicit positions (a KV cache), ``key_valid``. ``auto`` then picks
another kernel.

Lengths that are not a multiple of the blocks are padded: the padded keys get a segment id no query holds,
so they are hidden, and the padded queries are dropped.

Off TPU the same kernel runs in Pallas's interpret mode (slow, exact), which is how the CPU tests check the
code the TPU runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Shaped

from halyard.models.attention.context_parallel import ContextSplit
from halyard.models.attention.layout import FlatAttention
from halyard.named.nn import KERNEL_RESIDUALS

HIDDEN_SEGMENT = -(2**31)
"""The segment id of padded keys (and queries): no real token holds it, so they are never seen."""
LANES = 128
"""Splash's key blocks are a multiple of the TPU's 128 lanes; lengths are padded to a multiple of it."""


@dataclasses.dataclass(frozen=True)
class SplashBlockSizes:
    """Tile sizes of the splash kernel (``model.splash_block_sizes``); they change only the order of the online
    softmax's sums (so the last bits), not what is computed.

    Each is clipped to the (padded) sequence length. Key blocks are multiples of 128 (the TPU's lanes).

    Attributes:
        query: queries per block of the forward pass.
        key: keys per block of the forward pass (read from memory at once).
        key_compute: keys per inner step of the forward pass (divides ``key``).
        backward_query: queries per block of the backward passes (dK/dV and dQ).
        backward_key: keys per block of the backward passes.
        fused_backward: one backward kernel for dQ, dK and dV instead of two (dQ accumulated over key
            blocks in float32 memory).
    """

    query: int = 512
    key: int = 512
    key_compute: int = 512
    backward_query: int = 512
    backward_key: int = 512
    fused_backward: bool = False

    def __post_init__(self) -> None:
        for field in ("query", "key", "key_compute", "backward_query", "backward_key"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.splash_block_sizes.{field} must be a positive int, got {value!r}")
        for field in ("key", "key_compute", "backward_key"):
            if getattr(self, field) % LANES:
                raise ValueError(
                    f"model.splash_block_sizes.{field}={getattr(self, field)} must be a multiple of {LANES}"
                )
        if self.key % self.key_compute:
            raise ValueError(
                f"model.splash_block_sizes.key={self.key} must be a multiple of key_compute={self.key_compute}"
            )
        if not isinstance(self.fused_backward, bool):
            raise ValueError(
                f"model.splash_block_sizes.fused_backward must be true or false, got {self.fused_backward!r}"
            )


def splash_unsupported_reason(flat: FlatAttention) -> str | None:
    """Why the splash kernel cannot run these inputs, or None when it can (``auto`` and errors use it)."""
    if not flat.default_positions:
        return "splash attention needs the default positions 0, 1, ... (a KV cache passes its own: use 'blocked')"
    if flat.key_valid is not None:
        return (
            "splash attention has no AttentionMask.key_valid (hide keys with segment_ids, or use 'blocked')"
        )
    if flat.query.shape[1] != flat.key.shape[1]:
        return (
            f"splash attention needs as many keys as queries (self-attention), got {flat.key.shape[1]} keys "
            f"for {flat.query.shape[1]} queries"
        )
    return None


def splash_attention(
    flat: FlatAttention,
    *,
    scale: float,
    block_sizes: SplashBlockSizes | None = None,
    logit_softcap: float | None = None,
    interpret: bool | None = None,
) -> Shaped[Array, "batch pos heads head_size"]:
    """Attention of plain-array inputs with the Pallas splash kernel.

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        scale: the logit multiplier (applied to the queries before the kernel).
        block_sizes: the kernel's tiles; None: `SplashBlockSizes`'s defaults.
        logit_softcap: ``cap``: the scaled logits become ``cap * tanh(logits / cap)``; None: no capping.
        interpret: run in Pallas's interpret mode; None: everywhere but on a TPU.

    Returns:
        ``[batch, pos, heads, head_size]`` in the query's dtype.

    Raises:
        ValueError: inputs the kernel cannot run (`splash_unsupported_reason` says which).
    """
    reason = splash_unsupported_reason(flat)
    if reason is not None:
        raise ValueError(f"attention(implementation='splash'): {reason}")
    block_sizes = SplashBlockSizes() if block_sizes is None else block_sizes
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    batch, length, num_heads, _ = flat.query.shape
    blocks = _clipped_blocks(block_sizes, length)
    padded = _round_up(length, math.lcm(*blocks))
    kernel = _kernel(
        num_heads,
        padded,
        causal=flat.causal,
        sliding_window=flat.sliding_window,
        blocks=blocks,
        fused_backward=block_sizes.fused_backward,
        logit_softcap=logit_softcap,
        interpret=interpret,
    )
    # [B, S, heads, d] -> [B, heads, S, d], as the kernel reads them.
    query = _pad_positions((flat.query * jnp.asarray(scale, flat.query.dtype)).transpose(0, 2, 1, 3), padded)
    key = _pad_positions(flat.key.transpose(0, 2, 1, 3), padded)
    value = _pad_positions(flat.value.transpose(0, 2, 1, 3), padded)
    segments = _segment_ids(flat, batch, length, padded)
    if segments is None:
        output = jax.vmap(lambda q, k, v: kernel(q, k, v))(query, key, value)
    else:
        output = jax.vmap(lambda q, k, v, s: kernel(q, k, v, s))(query, key, value, segments)
    return output[:, :, :length].transpose(0, 2, 1, 3).astype(flat.query.dtype)


def sharded_splash_attention(
    flat: FlatAttention,
    split: ContextSplit | None,
    *,
    scale: float,
    block_sizes: SplashBlockSizes | None = None,
    logit_softcap: float | None = None,
) -> Shaped[Array, "batch pos heads head_size"]:
    """`splash_attention` on each device's share of the batch and heads when the active layout places them
    on several devices (a Pallas kernel is not partitioned by XLA: inside ``shard_map`` each device runs it
    on its own rows), else on the whole inputs.

    Args:
        flat: inputs laid out by `halyard.models.attention.layout.flatten_inputs`.
        split: the active layout's placement of the inputs (`layout_split`); None: no active layout.
        scale, block_sizes, logit_softcap: as for `splash_attention`.
    """
    run = functools.partial(
        splash_attention, scale=scale, block_sizes=block_sizes, logit_softcap=logit_softcap
    )
    if split is None or math.prod(dict(split.mesh.shape)[a] for a in (*split.batch, *split.heads)) < 2:
        return run(flat)
    reason = splash_unsupported_reason(flat)
    if reason is not None:
        raise ValueError(f"attention(implementation='splash'): {reason}")
    batch, heads = split.batch or None, split.heads or None
    array_spec, token_spec = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    has_segments = flat.query_segments is not None and flat.key_segments is not None

    def local(query: jax.Array, key: jax.Array, value: jax.Array, *segments: jax.Array) -> jax.Array:
        positions = jnp.broadcast_to(jnp.arange(query.shape[1], dtype=jnp.int32), query.shape[:2])
        share = dataclasses.replace(
            flat,
            query=query,
            key=key,
            value=value,
            query_positions=positions,
            key_positions=positions,
            query_segments=segments[0] if segments else None,
            key_segments=segments[1] if segments else None,
        )
        return run(share)

    segments = (flat.query_segments, flat.key_segments) if has_segments else ()
    sharded = jax.shard_map(
        local,
        mesh=split.mesh,
        in_specs=(array_spec, array_spec, array_spec, *([token_spec] * len(segments))),
        out_specs=array_spec,
        check_vma=False,
    )
    return sharded(flat.query, flat.key, flat.value, *segments)


def _segment_ids(flat: FlatAttention, batch: int, length: int, padded: int):  # -> SegmentIds | None
    """The kernel's segment ids: the mask's, or zeros; the padding gets `HIDDEN_SEGMENT`."""
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    if flat.query_segments is None and padded == length:
        return None
    query_segments = flat.query_segments
    key_segments = flat.key_segments
    if query_segments is None or key_segments is None:
        query_segments = key_segments = jnp.zeros((batch, length), jnp.int32)
    pad = ((0, 0), (0, padded - length))
    return SegmentIds(
        q=jnp.pad(query_segments.astype(jnp.int32), pad, constant_values=HIDDEN_SEGMENT),
        kv=jnp.pad(key_segments.astype(jnp.int32), pad, constant_values=HIDDEN_SEGMENT),
    )


def _clipped_blocks(block_sizes: SplashBlockSizes, length: int) -> tuple[int, int, int, int, int]:
    """``(query, key, key_compute, backward_query, backward_key)``, each at most the padded length."""
    longest = _round_up(length, LANES)
    return (
        min(block_sizes.query, longest),
        min(block_sizes.key, longest),
        min(block_sizes.key_compute, longest),
        min(block_sizes.backward_query, longest),
        min(block_sizes.backward_key, longest),
    )


def _pad_positions(array: jax.Array, padded: int) -> jax.Array:
    """``[B, heads, S, d]`` zero-padded to ``padded`` positions."""
    return jnp.pad(array, ((0, 0), (0, 0), (0, padded - array.shape[2]), (0, 0)))


def _round_up(length: int, block: int) -> int:
    return -(-length // block) * block


@functools.lru_cache(maxsize=64)
def _kernel(
    num_heads: int,
    length: int,
    *,
    causal: bool,
    sliding_window: int | None,
    blocks: tuple[int, int, int, int, int],
    fused_backward: bool,
    logit_softcap: float | None,
    interpret: bool,
):  # -> SplashAttentionKernel
    """The splash kernel for one shape and static mask (built once: its mask tables are made in numpy)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape = (length, length)
    one_head: splash.Mask
    if sliding_window is not None:  # key > query - window: (window - 1) keys to the left of the query
        one_head = splash.LocalMask(shape, window_size=(sliding_window - 1, 0 if causal else None), offset=0)
    elif causal:
        one_head = splash.CausalMask(shape)
    else:
        one_head = splash.FullMask(shape)
    query, key, key_compute, backward_query, backward_key = blocks
    sizes = splash.BlockSizes(
        block_q=query,
        block_kv=key,
        block_kv_compute=key_compute,
        block_q_dkv=backward_query,
        block_kv_dkv=backward_key,
        block_kv_dkv_compute=backward_key,
        block_q_dq=None if fused_backward else backward_query,
        block_kv_dq=None if fused_backward else backward_key,
        use_fused_bwd_kernel=fused_backward,
    )
    # Concrete mask tables even when first built inside a trace (the cache outlives the trace).
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            splash.MultiHeadMask([one_head] * num_heads),
            block_sizes=sizes,
            head_shards=1,
            q_seq_shards=1,
            attn_logits_soft_cap=logit_softcap,
            interpret=interpret,
            # The forward's output and log-sum-exp, kept by the remat policies that keep kernel residuals
            # (the backward kernels then need no second forward pass).
            residual_checkpoint_name=KERNEL_RESIDUALS,
        )
