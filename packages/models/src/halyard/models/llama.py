"""Llama, and the families that share its decoder: Mistral (sliding window) and Qwen2 (q/k/v bias).

h = x + Attention(RMSNorm(x))          # RoPE, grouped-query heads
y = h + SwiGLU(RMSNorm(h))
logits = RMSNorm(y_L) · W_out          # W_out = embedding when tied
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.attention import AttentionMask
from halyard.models.config import ModelConfig, register_model
from halyard.models.flops import decoder_flops_per_token
from halyard.models.layers.activations import check_activation
from halyard.models.layers.kv_cache import KVCache
from halyard.models.layers.mlp import GatedMLP
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.model import CausalLM, DecoderOutput, build_model
from halyard.models.rotary import RotaryConfig
from halyard.models.stack import LayerStack
from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, Linear, RMSNorm
from halyard.shard import constrain


@register_model("llama")
@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """A Llama-style decoder (defaults: Llama-2 7B shapes).

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width (``embed``).
        intermediate_size: MLP width (``mlp``).
        num_layers: decoder layers.
        num_heads: query heads; num_kv_heads: key/value heads (== num_heads: MHA, 1: MQA, else GQA).
        head_dim: size of one head, independent of the width; None means ``hidden_size // num_heads``.
        max_position: longest sequence the positions are configured for (rotary scaling uses it).
        rope: rotary embedding configuration (theta and scaling: default, linear, dynamic, llama3, yarn).
        rms_norm_eps: RMSNorm epsilon.
        tie_embeddings: share the input embedding with the output projection.
        attention_bias: biases on q/k/v (and on the output projection unless ``qkv_bias_only``).
        qkv_bias_only: with ``attention_bias``, no bias on the output projection (Qwen2).
        mlp_bias: biases in the MLP.
        sliding_window: attend only to the last ``sliding_window`` positions (Mistral), or None.
        activation: MLP gate activation (``silu`` for SwiGLU).
        initializer_range: std of every weight at init (Hugging Face's convention).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int | None = None
    max_position: int = 4096
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=10000.0))
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias_only: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    activation: str = "silu"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
        ):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{name}.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"{name}.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"{name}.sliding_window must be positive or None, got {self.sliding_window}")
        check_activation(self.activation, f"{name}.activation")

    @property
    def head_size(self) -> int:
        """Size of one attention head."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.num_kv_heads

    def init(self, key: jax.Array) -> Llama:
        """A `Llama` with parameters drawn as in Hugging Face (N(0, initializer_range**2), norms at one)."""
        return build_model(Llama, self, key)

    def num_params(self) -> int:
        """Parameter count (tied embeddings once)."""
        embed, heads, kv, size = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_size
        attention = embed * size * (heads + 2 * kv) + heads * size * embed
        if self.attention_bias:
            attention += size * (heads + 2 * kv) + (0 if self.qkv_bias_only else embed)
        mlp = 3 * embed * self.intermediate_size
        if self.mlp_bias:
            mlp += 2 * self.intermediate_size + embed
        per_layer = attention + mlp + 2 * embed
        embeddings = self.vocab_size * embed * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embeddings + embed

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward); see `halyard.models.flops`."""
        dense = (
            self.hidden_size * self.head_size * (2 * self.num_heads + 2 * self.num_kv_heads)
            + 3 * self.hidden_size * self.intermediate_size
        )
        return decoder_flops_per_token(
            matmul_params_per_layer=dense,
            num_layers=self.num_layers,
            attention_width=self.num_heads * self.head_size,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            seq_len=seq_len,
            sliding_window=self.sliding_window,
        )


@register_model("mistral")
@dataclasses.dataclass(frozen=True)
class MistralConfig(LlamaConfig):
    """Mistral: the Llama decoder with sliding-window attention (defaults: Mistral 7B v0.1 shapes)."""

    intermediate_size: int = 14336
    num_kv_heads: int = 8
    max_position: int = 32768
    sliding_window: int | None = 4096
    rms_norm_eps: float = 1e-5


@register_model("qwen2")
@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """Qwen2: the Llama decoder with q/k/v biases and no output-projection bias (defaults: Qwen2 7B shapes)."""

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_layers: int = 28
    num_heads: int = 28
    num_kv_heads: int = 4
    max_position: int = 32768
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=1000000.0))
    rms_norm_eps: float = 1e-6
    attention_bias: bool = True
    qkv_bias_only: bool = True


class LlamaBlock(eqx.Module):
    """One decoder layer: pre-norm attention and pre-norm gated MLP, each added to the residual."""

    input_norm: RMSNorm
    attention: SelfAttention
    post_attention_norm: RMSNorm
    mlp: GatedMLP

    @classmethod
    def init(cls, config: LlamaConfig, *, key: jax.Array) -> LlamaBlock:
        """A layer with Hugging Face's initialisation (all weights N(0, initializer_range**2))."""
        Embed, Mlp = Axis("embed", config.hidden_size), Axis("mlp", config.intermediate_size)
        attention_key, mlp_key = jax.random.split(key)
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
            dtype=dtype,
        )
        mlp = GatedMLP.init(
            Embed, Mlp, key=mlp_key, act=config.activation, use_bias=config.mlp_bias,
            init_std=std, down_init_std=std, dtype=dtype,
        )  # fmt: skip
        norm = RMSNorm.init(Embed, eps=config.rms_norm_eps, dtype=dtype)
        return cls(norm, attention, norm, mlp)

    def __call__(
        self,
        x: NamedArray,
        mask: AttentionMask,
        positions: NamedArray,
        cache: Any = None,
        cache_index: Any = None,
    ) -> tuple[NamedArray, Any]:
        """``x (batch, pos, embed) -> (same, updated layer cache)``."""
        attended, cache = self.attention(self.input_norm(x), mask, positions, cache, cache_index)
        h = constrain(x + attended)
        return constrain(h + self.mlp(self.post_attention_norm(h))), cache


class Llama(CausalLM):
    """The Llama / Mistral / Qwen2 decoder.

    Attributes:
        embed: token embedding ``(vocab, embed)``.
        layers: the stacked `LlamaBlock`s (``layers`` axis).
        norm: final RMSNorm.
        lm_head: ``embed -> vocab`` output projection, None when embeddings are tied.
        config: the `LlamaConfig` (static).
    """

    embed: Embedding
    layers: LayerStack
    norm: RMSNorm
    lm_head: Linear | None
    config: LlamaConfig = eqx.field(static=True)

    @classmethod
    def init(cls, config: LlamaConfig, *, key: jax.Array) -> Llama:
        """Initialise every parameter from ``key`` (see `LlamaConfig.init`)."""
        embed_key, layers_key, head_key = jax.random.split(key, 3)
        Embed, Vocab = Axis("embed", config.hidden_size), Axis("vocab", config.vocab_size)
        dtype = config.params
        embed = Embedding.init(Vocab, Embed, key=embed_key, init_std=config.initializer_range, dtype=dtype)
        layers = LayerStack.init(
            lambda k: LlamaBlock.init(config, key=k), config.num_layers, key=layers_key,
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
    def model_config(self) -> LlamaConfig:
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
    ) -> DecoderOutput:
        """See `CausalLM.decoder`."""
        x = constrain(self.embed(tokens).astype(self.embed.weight.dtype))

        def step(layer: LlamaBlock, h: NamedArray, *layer_cache: NamedArray) -> tuple[NamedArray, Any]:
            out, new_cache = layer(h, mask, positions, tuple(layer_cache) or None, cache_index)
            return out, new_cache

        if cache is None:
            x, _ = self.layers.apply(step, x)
            new_cache = None
        else:
            x, (keys, values) = self.layers.apply(step, x, cache.key, cache.value)
            new_cache = KVCache(keys, values)
        return DecoderOutput(self.norm(x), jnp.zeros((), jnp.float32), {}, new_cache)
