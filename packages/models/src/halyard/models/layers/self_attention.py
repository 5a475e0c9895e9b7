"""`SelfAttention`: projections to queries, keys and values, rotary positions, attention, output projection.

Shared by every family. Grouped-query attention follows the Hugging Face convention (query head ``h``
reads key/value head ``h // (num_heads // num_kv_heads)``). In an inference engine's step (`PagedKV`) the
new keys and values are stored in the pool and the queries attend over their sequences' pages there.
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
from jax.ad_checkpoint import checkpoint_name

from halyard.models.attention import AttentionMask, attention
from halyard.models.attention.splash import SplashBlockSizes
from halyard.models.layers.paged_kv import PagedLayer
from halyard.models.reports import report_attention_logit_max
from halyard.models.rotary import RotaryConfig, apply_rotary
from halyard.named import Axis, NamedArray
from halyard.named.nn import DotGeneral, Linear, RMSNorm
from halyard.shard import constrain

HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_SIZE = "head_size"


class SelfAttention(eqx.Module):
    """Multi-head (grouped-query) causal self-attention.

    Attributes:
        q_proj: ``embed -> (heads, head_size)``; k_proj, v_proj: ``embed -> (kv_heads, head_size)``;
        o_proj: ``(heads, head_size) -> embed``.
        q_norm, k_norm: RMSNorms of the queries and keys before rotary (per head or over the whole
            projection), or None.
        max_position: the longest position the model was configured for (static; rotary scaling).
        scale: attention logit scale, None for ``1/sqrt(head_size)`` (static; muP uses ``1/head_size``).
        softcap: ``cap * tanh(logits / cap)`` on the attention logits, or None (static).
        implementation: attention kernel name (static).
        block_size: queries and keys per block of the ``blocked`` kernel (static; None: 64 on CPU, else 128).
        context_parallel: ``auto`` | ``ring`` | ``all_gather`` | ``ulysses``: how attention runs when the
            active layout splits ``pos`` over several devices (static; `halyard.models.attention`).
        splash_block_sizes: the ``splash`` kernel's tiles (static; None: its defaults).
    """

    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    max_position: int = eqx.field(static=True)
    scale: float | None = eqx.field(static=True)
    softcap: float | None = eqx.field(static=True)
    implementation: str = eqx.field(static=True)
    block_size: int | None = eqx.field(static=True, default=None)
    context_parallel: str = eqx.field(static=True, default="auto")
    splash_block_sizes: SplashBlockSizes | None = eqx.field(static=True, default=None)

    @classmethod
    def init(
        cls,
        Embed: Axis,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        key: jax.Array,
        qkv_bias: bool,
        out_bias: bool,
        init_std: float,
        out_init_std: float,
        max_position: int,
        scale: float | None = None,
        softcap: float | None = None,
        qk_norm: str | None = None,
        norm_eps: float = 1e-6,
        norm_offset: float = 0.0,
        implementation: str = "auto",
        query_init_std: float | None = None,
        block_size: int | None = None,
        context_parallel: str = "auto",
        splash_block_sizes: SplashBlockSizes | None = None,
        dot_general: DotGeneral | None = None,
        dtype: Any,
    ) -> SelfAttention:
        """Create the four projections (N(0, std**2) weights, zero biases).

        Args:
            Embed: the model axis.
            num_heads, num_kv_heads: query heads and key/value heads (``num_heads % num_kv_heads == 0``).
            head_size: size of one head (independent of the model width).
            key: PRNG key.
            qkv_bias, out_bias: biases on the q/k/v projections and on the output projection.
            init_std, out_init_std: weight std of q/k/v and of the output projection.
            query_init_std: weight std of the query projection when it differs (muP zero-init: 0.0).
            max_position: longest configured position.
            scale: logit scale, None for ``1/sqrt(head_size)``.
            softcap: attention-logit soft-capping, or None.
            qk_norm: RMSNorm queries and keys ``head`` by head, over the whole ``projection``, or None;
                ``norm_eps`` and ``norm_offset`` configure those norms.
            implementation: attention kernel (`halyard.models.attention.attention`).
            block_size: queries and keys per block of the ``blocked`` kernel (None: the backend's default).
            context_parallel: attention over a sequence split across devices (`attention`'s argument).
            splash_block_sizes: the ``splash`` kernel's tiles (None: its defaults).
            dot_general: the four projections' contraction (None: `Linear`'s default; `int8_dot_general`
                for int8 training).
            dtype: parameter dtype.

        Raises:
            ValueError: ``num_heads`` is not a multiple of ``num_kv_heads``.
        """
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} (grouped-query attention)"
            )
        Heads, KVHeads, HeadSize = (
            Axis(HEADS, num_heads),
            Axis(KV_HEADS, num_kv_heads),
            Axis(HEAD_SIZE, head_size),
        )
        q_key, k_key, v_key, o_key = jax.random.split(key, 4)
        q_std = init_std if query_init_std is None else query_init_std
        projection = functools.partial(Linear.init, dtype=dtype, dot_general=dot_general)
        q_proj = projection(Embed, (Heads, HeadSize), key=q_key, use_bias=qkv_bias, init_std=q_std)
        k_proj = projection(Embed, (KVHeads, HeadSize), key=k_key, use_bias=qkv_bias, init_std=init_std)
        v_proj = projection(Embed, (KVHeads, HeadSize), key=v_key, use_bias=qkv_bias, init_std=init_std)
        o_proj = projection((Heads, HeadSize), Embed, key=o_key, use_bias=out_bias, init_std=out_init_std)
        q_norm = k_norm = None
        if qk_norm is not None:
            q_axes = (HeadSize,) if qk_norm == "head" else (Heads, HeadSize)
            k_axes = (HeadSize,) if qk_norm == "head" else (KVHeads, HeadSize)
            q_norm = RMSNorm.init(q_axes, eps=norm_eps, offset=norm_offset, dtype=dtype)
            k_norm = RMSNorm.init(k_axes, eps=norm_eps, offset=norm_offset, dtype=dtype)
        return cls(
            q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, max_position, scale, softcap, implementation,
            block_size, context_parallel, splash_block_sizes,
        )  # fmt: skip

    def __call__(
        self,
        x: NamedArray,
        mask: AttentionMask,
        positions: NamedArray,
        rope: RotaryConfig | None,
        cache: tuple[PagedLayer, Any] | None = None,
    ) -> tuple[NamedArray, Any]:
        """Attend from every position of ``x`` to the visible keys.

        Args:
            x: hidden states ``(batch..., pos, embed)``.
            mask: which keys each query sees (causal, window, segments; slots when decoding).
            positions: rotary position of each token ``(batch..., pos)``.
            rope: this layer's rotary configuration, or None (learned positions, added by the model).
            cache: in an engine's step, ``(this layer's view of it (`PagedKV.for_layer_scan`), the pool)``;
                None otherwise.

        Returns:
            ``(output (batch..., pos, embed), the pool with this layer's keys and values stored)``; None
            for the pool without a ``cache``.
        """
        query = constrain(self.q_proj(x))
        key = constrain(self.k_proj(x))
        value = constrain(self.v_proj(x))
        if self.q_norm is not None and self.k_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        if rope is not None:
            query = apply_rotary(query, positions, rope, max_position=self.max_position)
            key = apply_rotary(key, positions, rope, max_position=self.max_position)
        key = key.rename({"pos": "key_pos"})
        value = value.rename({"pos": "key_pos"})
        if cache is not None:  # an engine's step: keys stored in the pool, pages read there by the kernel
            layer, pool = cache
            attended, pool = layer.attend(
                pool,
                query,
                key,
                value,
                scale=self.scale if self.scale is not None else query.axis_size(HEAD_SIZE) ** -0.5,
                sliding_window=mask.sliding_window,
                logit_softcap=self.softcap,
            )
            return self.o_proj(constrain(attended)), pool
        softcap: dict[str, float] = {} if self.softcap is None else {"logit_softcap": self.softcap}
        report_attention_logit_max(query, key, mask, self.scale)  # when a step collects (trainer.watch.model)
        # What remat "save_attention" keeps (ATTENTION_SAVED_NAMES): the kernel's inputs and its output.
        query, key, value = (
            _named_checkpoint(query, "attention_query"),
            _named_checkpoint(key, "attention_key"),
            _named_checkpoint(value, "attention_value"),
        )
        attended = attention(
            query,
            key,
            value,
            mask,
            implementation=self.implementation,
            scale=self.scale,
            block_size=self.block_size,
            context_parallel=self.context_parallel,
            splash_block_sizes=self.splash_block_sizes,
            **softcap,
        )
        return self.o_proj(constrain(_named_checkpoint(attended, "attention_output"))), None


def _named_checkpoint(x: NamedArray, name: str) -> NamedArray:
    """``x`` with its array tagged ``name`` for `jax.checkpoint` policies (an identity otherwise)."""
    return NamedArray(checkpoint_name(x.array, name), x.axes)
