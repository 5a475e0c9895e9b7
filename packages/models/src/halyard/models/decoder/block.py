"""`DecoderBlock`: the one decoder layer every family uses, arranged by its `BlockLayout`.

h = x + post_attention_norm(attention(pre_attention_norm(x)))
y = h + post_mlp_norm(mlp(pre_mlp_norm(h)))

(a norm the layout leaves out is the identity.) The layer's `LayerKind` (attention window, rotary setting)
arrives with each call, so layers that differ only by it share one stacked parameter tree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.attention import AttentionMask
from halyard.models.decoder.layout import BlockLayout, LayerKind
from halyard.models.decoder.spec import DecoderSpec
from halyard.models.layers.mlp import MLP, GatedMLP
from halyard.models.layers.moe import MoeMLP
from halyard.models.layers.paged_kv import PagedLayer
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.reports import report_rms
from halyard.named import Axis, NamedArray
from halyard.named.nn import LayerNorm, RMSNorm
from halyard.shard import constrain

Norm = RMSNorm | LayerNorm


def make_norm(layout: BlockLayout, Embed: Axis, dtype: Any) -> Norm:
    """A norm over ``embed`` as the layout says (RMSNorm with its offset and gains, or LayerNorm)."""
    if layout.norm == "layer":
        return LayerNorm.init(Embed, eps=layout.norm_eps, use_weight=layout.norm_gains, dtype=dtype)
    return RMSNorm.init(
        Embed, eps=layout.norm_eps, offset=layout.norm_offset, use_weight=layout.norm_gains, dtype=dtype
    )


class DecoderBlock(eqx.Module):
    """One decoder layer (see the module docstring); absent norms are None.

    Attributes:
        attention_norm, post_attention_norm, mlp_norm, post_mlp_norm: the four possible norms.
        attention: `SelfAttention`.
        mlp: `MLP`, `GatedMLP` or `MoeMLP`.
        report_coordinates: also return mean |activation| of the attention output, MLP output and
            residual (static; muP coordinate checks).
    """

    attention_norm: Norm | None
    attention: SelfAttention
    post_attention_norm: Norm | None
    mlp_norm: Norm | None
    mlp: MLP | GatedMLP | MoeMLP
    post_mlp_norm: Norm | None
    report_coordinates: bool = eqx.field(static=True, default=False)

    @classmethod
    def init(cls, config: DecoderSpec, *, key: jax.Array) -> DecoderBlock:
        """A layer with the family's initialisation (`BlockLayout`'s stds; zero biases, unit norms)."""
        shape, layout, dtype = config.shape, config.layout(), config.params
        Embed, Mlp = Axis("embed", shape.embed), Axis("mlp", shape.mlp)
        attention_key, mlp_key = jax.random.split(key)
        std = layout.init_std
        out_std = std if layout.out_init_std is None else layout.out_init_std
        mlp_out_std = std if layout.mlp_out_init_std is None else layout.mlp_out_init_std
        projection = config.projection_dot_general()
        attention = SelfAttention.init(
            Embed, num_heads=shape.heads, num_kv_heads=shape.kv_heads, head_size=shape.head_size,
            max_position=shape.max_position, key=attention_key, dtype=dtype,
            qkv_bias=layout.qkv_bias, out_bias=layout.out_bias, scale=layout.attention_scale,
            softcap=layout.attention_softcap, qk_norm=layout.qk_norm, norm_eps=layout.norm_eps,
            norm_offset=layout.norm_offset, init_std=std, out_init_std=out_std,
            query_init_std=layout.query_init_std, implementation=config.attention_implementation,
            block_size=config.attention_block_size, context_parallel=config.context_parallel,
            splash_block_sizes=config.splash_block_sizes, dot_general=projection,
        )  # fmt: skip
        mlp: MLP | GatedMLP | MoeMLP
        if layout.mlp == "moe":
            mlp = MoeMLP.init(
                Embed, Mlp, Axis("experts", layout.num_experts), top_k=layout.experts_per_token,
                key=mlp_key, act=layout.activation, init_std=std, dtype=dtype,
            )  # fmt: skip
        else:
            mlp_class = MLP if layout.mlp == "plain" else GatedMLP
            mlp = mlp_class.init(
                Embed, Mlp, key=mlp_key, act=layout.activation, use_bias=layout.mlp_bias,
                init_std=std, down_init_std=mlp_out_std, dtype=dtype, dot_general=projection,
            )  # fmt: skip

        def norm(present: bool) -> Norm | None:
            return make_norm(layout, Embed, dtype) if present else None

        return cls(
            attention_norm=norm(layout.pre_attention_norm),
            attention=attention,
            post_attention_norm=norm(layout.post_attention_norm),
            mlp_norm=norm(layout.pre_mlp_norm),
            mlp=mlp,
            post_mlp_norm=norm(layout.post_mlp_norm),
            report_coordinates=layout.report_coordinates,
        )

    def __call__(
        self,
        x: Any,
        mask: AttentionMask,
        positions: NamedArray,
        *cache: PagedLayer,
        kind: LayerKind,
        token_mask: NamedArray | None = None,
    ) -> tuple[Any, tuple[None, Any]]:
        """``x (batch..., pos, embed) -> (same, (None, extras))``; in an engine's step ``(x, pool) -> (same,
        (None, extras))``, the pool with this layer's keys and values stored.

        Args:
            x: the residual stream, or ``(residual stream, pool)`` with a ``cache`` (the pool travels in
                the layer scan's carry, so the step writes it in place).
            mask: the attention mask; this layer's window is added unless the mask has one.
            positions: token positions ``(batch..., pos)`` (rotary).
            cache: an engine's pages as this layer sees them (`PagedKV.for_layer_scan`), or nothing.
            kind: this layer's window and rotary setting.
            token_mask: 0/1 per token for the MoE router statistics (None: every token counts).

        Returns:
            extras: the MoE `RouterStats`, the coordinates dict (``report_coordinates``), or None.
        """
        if kind.window is not None and mask.sliding_window is None:
            mask = dataclasses.replace(mask, sliding_window=kind.window)
        pool = None
        if cache:
            x, pool = x
        attention_in = x if self.attention_norm is None else self.attention_norm(x)
        attended, pool = self.attention(
            attention_in, mask, positions, kind.rope, (cache[0], pool) if cache else None
        )
        if self.post_attention_norm is not None:
            attended = self.post_attention_norm(attended)
        h = constrain(x + attended)
        mlp_in = h if self.mlp_norm is None else self.mlp_norm(h)
        extras: Any = None
        if isinstance(self.mlp, MoeMLP):
            mlp_out, extras = self.mlp(mlp_in, token_mask)
        else:
            mlp_out = self.mlp(mlp_in)
        if self.post_mlp_norm is not None:
            mlp_out = self.post_mlp_norm(mlp_out)
        out = constrain(h + mlp_out)
        report_rms("activation/rms", out)  # when a step collects (trainer.watch.model)
        if self.report_coordinates:
            extras = {
                "attention": jnp.mean(jnp.abs(attended.array)),
                "mlp": jnp.mean(jnp.abs(mlp_out.array)),
                "residual": jnp.mean(jnp.abs(out.array)),
            }
        return (out, pool) if cache else out, (None, extras)
