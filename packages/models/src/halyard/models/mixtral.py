"""Mixtral: the Llama decoder with each MLP replaced by top-k routed experts (`MoeMLP`).

h = x + Attention(RMSNorm(x))
y = h + MoE(RMSNorm(h))                      # top_k of num_experts SwiGLU experts per token
loss = CE + router_aux_loss_coef * load_balancing + router_z_loss_coef * router_z

The router losses are means over the batch's real tokens: `CausalLM.loss` passes the loss mask as the
decoder's ``token_mask``, so padding and loss-masked positions do not count in them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import equinox as eqx
import jax

from halyard.models.attention import AttentionMask
from halyard.models.config import register_model
from halyard.models.flops import decoder_flops_per_token
from halyard.models.layers.kv_cache import KVCache
from halyard.models.layers.moe import MoeMLP, RouterStats, load_balancing_loss, router_z_loss
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.llama import LlamaConfig
from halyard.models.model import CausalLM, DecoderOutput, build_model
from halyard.models.rotary import RotaryConfig
from halyard.models.stack import LayerStack
from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, Linear, RMSNorm
from halyard.shard import constrain


@register_model("mixtral")
@dataclasses.dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    """Mixtral (defaults: Mixtral 8x7B shapes). Every `LlamaConfig` field applies; in addition:

    Attributes:
        num_experts: experts per layer (the ``experts`` axis).
        num_experts_per_token: experts each token is routed to (top-k).
        router_aux_loss_coef: weight of the load-balancing loss added to the training loss.
        router_z_loss_coef: weight of the router z-loss added to the training loss.

    ``remat`` defaults to ``none`` here: ``save_dots`` keeps only ``dot_general`` results, so the experts'
    ``ragged_dot`` products would be recomputed (+19% step time measured on CPU).
    """

    intermediate_size: int = 14336
    num_kv_heads: int = 8
    max_position: int = 32768
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    num_experts: int = 8
    num_experts_per_token: int = 2
    router_aux_loss_coef: float = 0.02
    router_z_loss_coef: float = 0.001
    remat: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mlp_bias:
            raise ValueError("MixtralConfig.mlp_bias is not supported: Mixtral experts have no biases")
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"MixtralConfig.num_experts_per_token={self.num_experts_per_token} must lie between 1 and "
                f"num_experts={self.num_experts}"
            )

    def init(self, key: jax.Array) -> Mixtral:  # type: ignore[override]  # a config subclass, not a Llama
        """A `Mixtral` with every weight drawn from N(0, initializer_range**2)."""
        return build_model(Mixtral, self, key)

    def num_params(self) -> int:
        """Parameter count (all experts)."""
        dense_mlp = 3 * self.hidden_size * self.intermediate_size
        if self.mlp_bias:
            dense_mlp += 2 * self.intermediate_size + self.hidden_size
        dense = LlamaConfig.num_params(self) - self.num_layers * dense_mlp  # attention, norms, embeddings
        experts = self.num_layers * (self.num_experts * 3 * self.hidden_size * self.intermediate_size)
        router = self.num_layers * self.num_experts * self.hidden_size
        return dense + experts + router

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token counting the router and the ``num_experts_per_token`` active experts."""
        attention = self.hidden_size * self.head_size * (2 * self.num_heads + 2 * self.num_kv_heads)
        active = self.num_experts_per_token * 3 * self.hidden_size * self.intermediate_size
        return decoder_flops_per_token(
            matmul_params_per_layer=attention + active + self.num_experts * self.hidden_size,
            num_layers=self.num_layers,
            attention_width=self.num_heads * self.head_size,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            seq_len=seq_len,
            sliding_window=self.sliding_window,
        )


class MixtralBlock(eqx.Module):
    """One layer: pre-norm attention, then pre-norm routed experts."""

    input_norm: RMSNorm
    attention: SelfAttention
    post_attention_norm: RMSNorm
    moe: MoeMLP

    @classmethod
    def init(cls, config: MixtralConfig, *, key: jax.Array) -> MixtralBlock:
        """A layer with all weights N(0, initializer_range**2)."""
        Embed = Axis("embed", config.hidden_size)
        attention_key, moe_key = jax.random.split(key)
        std, dtype = config.initializer_range, config.params
        attention = SelfAttention.init(
            Embed,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_size=config.head_size,
            key=attention_key,
            qkv_bias=config.attention_bias,
            out_bias=config.attention_bias and not config.qkv_bias_only,
            init_std=std,
            out_init_std=std,
            rope=config.rope,
            max_position=config.max_position,
            implementation=config.attention_implementation,
            block_size=config.attention_block_size,
            dtype=dtype,
        )
        moe = MoeMLP.init(
            Embed, Axis("mlp", config.intermediate_size), Axis("experts", config.num_experts),
            top_k=config.num_experts_per_token, key=moe_key, act=config.activation, init_std=std, dtype=dtype,
        )  # fmt: skip
        norm = RMSNorm.init(Embed, eps=config.rms_norm_eps, dtype=dtype)
        return cls(norm, attention, norm, moe)

    def __call__(
        self,
        x: NamedArray,
        mask: AttentionMask,
        positions: NamedArray,
        cache: Any = None,
        cache_index: Any = None,
        token_mask: NamedArray | None = None,
    ) -> tuple[NamedArray, tuple[Any, RouterStats]]:
        """``x (batch, pos, embed) -> (same, (updated layer cache, router statistics))``.

        ``token_mask`` (``batch, pos``; None: all) selects the tokens counted in the router statistics.
        """
        attended, cache = self.attention(self.input_norm(x), mask, positions, cache, cache_index)
        h = constrain(x + attended)
        routed, stats = self.moe(self.post_attention_norm(h), token_mask)
        return constrain(h + routed), (cache, stats)


class Mixtral(CausalLM):
    """The Mixtral decoder (attributes as in `Llama`)."""

    embed: Embedding
    layers: LayerStack
    norm: RMSNorm
    lm_head: Linear | None
    config: MixtralConfig = eqx.field(static=True)
    decoder_takes_token_mask: ClassVar[bool] = True

    @classmethod
    def init(cls, config: MixtralConfig, *, key: jax.Array) -> Mixtral:
        """Initialise every parameter from ``key``."""
        embed_key, layers_key, head_key = jax.random.split(key, 3)
        Embed, Vocab, dtype = (
            Axis("embed", config.hidden_size),
            Axis("vocab", config.vocab_size),
            config.params,
        )
        embed = Embedding.init(Vocab, Embed, key=embed_key, init_std=config.initializer_range, dtype=dtype)
        layers = LayerStack.init(
            lambda k: MixtralBlock.init(config, key=k), config.num_layers, key=layers_key,
            scan=config.scan_layers, remat=config.remat,
        )  # fmt: skip
        norm = RMSNorm.init(Embed, eps=config.rms_norm_eps, dtype=dtype)
        lm_head = None
        if not config.tie_embeddings:
            lm_head = Linear.init(
                Embed, Vocab, key=head_key, use_bias=False, init_std=config.initializer_range, dtype=dtype
            )
        return cls(embed, layers, norm, lm_head, config)

    @property
    def model_config(self) -> MixtralConfig:
        return self.config

    @property
    def unembedding(self) -> NamedArray:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def decoder(
        self,
        tokens: NamedArray,
        *,
        mask: AttentionMask,
        positions: NamedArray,
        cache: KVCache | None = None,
        cache_index: Any = None,
        token_mask: NamedArray | None = None,
    ) -> DecoderOutput:
        """See `CausalLM.decoder`; ``aux_loss`` holds the weighted load-balancing and router z-losses.

        Args:
            token_mask: 0/1 per token ``(batch..., pos)``: the router losses are means over the tokens
                where it is 1 (`CausalLM.loss` passes the loss mask); None counts every token.
        """
        x = constrain(self.embed(tokens))

        def step(layer: MixtralBlock, h: NamedArray, *layer_cache: NamedArray) -> tuple[NamedArray, Any]:
            return layer(h, mask, positions, tuple(layer_cache) or None, cache_index, token_mask)

        if cache is None:
            x, (_, stats) = self.layers.apply(step, x)
            new_cache = None
        else:
            x, ((keys, values), stats) = self.layers.apply(step, x, cache.key, cache.value)
            new_cache = KVCache(keys, values)
        balance, z_loss = load_balancing_loss(stats), router_z_loss(stats)
        aux = self.config.router_aux_loss_coef * balance + self.config.router_z_loss_coef * z_loss
        metrics = {"load_balancing_loss": balance, "router_z_loss": z_loss}
        return DecoderOutput(self.norm(x), aux, metrics, new_cache)
