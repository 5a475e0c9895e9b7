"""Llama, and the families that share its decoder: Mistral (sliding window) and Qwen2 (q/k/v bias).

h = x + Attention(RMSNorm(x))          # RoPE, grouped-query heads
y = h + SwiGLU(RMSNorm(h))
logits = RMSNorm(y_L) · W_out          # W_out = embedding when tied

Per-layer attention windows (Qwen2's ``use_sliding_window`` with ``max_window_layers``): the first
``full_attention_layers`` layers attend to every earlier position, the later ones only to the last
``sliding_window``. The layers stay one `LayerStack` (one parameter tree whatever the windows), and the
decoder runs it as two consecutive scans over slices of that stack, one per window. A window is a
static property of the attention mask (every attention implementation specialises on it), so this keeps
each scan over identical layers with one static mask, where a scanned per-layer window would have to
become a traced mask value in every implementation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models.attention import AttentionMask
from halyard.models.config import ModelConfig, register_model
from halyard.models.flops import decoder_flops_per_token
from halyard.models.layers.activations import check_activation
from halyard.models.layers.kv_cache import KVCache
from halyard.models.layers.mlp import GatedMLP
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.model import CausalLM, DecoderOutput, build_model
from halyard.models.rotary import RotaryConfig
from halyard.models.stack import LAYERS, LayerStack
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
        full_attention_layers: with ``sliding_window``, the first this-many layers attend to every earlier
            position and only the later layers use the window (Hugging Face Qwen2's ``max_window_layers``
            when ``use_sliding_window``); 0: every layer uses the window. See `layer_windows`.
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
    full_attention_layers: int = 0
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
        sizes = (
            f"head_dim={self.head_dim}"
            if self.head_dim
            else f"hidden_size={self.hidden_size} / num_heads={self.num_heads}"
        )
        self.rope.check_head_size(self.head_size, f"{name}.{sizes}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"{name}.sliding_window must be positive or None, got {self.sliding_window}")
        if self.full_attention_layers:
            if self.family not in ("llama", "mistral", "qwen2"):
                raise ValueError(
                    f"{name}.full_attention_layers={self.full_attention_layers}: the {self.family!r} family "
                    "uses one window for every layer; leave it 0"
                )
            if not 0 <= self.full_attention_layers <= self.num_layers:
                raise ValueError(
                    f"{name}.full_attention_layers={self.full_attention_layers} must lie between 0 and "
                    f"num_layers={self.num_layers}"
                )
            if self.sliding_window is None:
                raise ValueError(
                    f"{name}.full_attention_layers={self.full_attention_layers} only applies with a "
                    "sliding_window; set sliding_window or leave full_attention_layers 0"
                )
        check_activation(self.activation, f"{name}.activation")

    @property
    def head_size(self) -> int:
        """Size of one attention head."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.num_kv_heads

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: every earlier position), in layer order."""
        return tuple(
            None if index < self.full_attention_layers else self.sliding_window
            for index in range(self.num_layers)
        )

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

        def flops(num_layers: int, window: int | None) -> float:
            return decoder_flops_per_token(
                matmul_params_per_layer=dense,
                num_layers=num_layers,
                attention_width=self.num_heads * self.head_size,
                vocab_size=self.vocab_size,
                hidden_size=self.hidden_size,
                seq_len=seq_len,
                sliding_window=window,
            )

        # Layers without the window attend to more keys; the output projection is counted once.
        full_attention_extra = flops(1, None) - flops(1, self.sliding_window)
        return flops(self.num_layers, self.sliding_window) + self.full_attention_layers * full_attention_extra


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
            block_size=config.attention_block_size,
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
        keys: list[NamedArray] = []
        values: list[NamedArray] = []
        for start, stop, segment_mask in self._segments(mask):

            def step(
                layer: LlamaBlock, h: NamedArray, *layer_cache: NamedArray, mask: AttentionMask = segment_mask
            ) -> tuple[NamedArray, Any]:
                out, new_cache = layer(h, mask, positions, tuple(layer_cache) or None, cache_index)
                return out, new_cache

            layers = self._layer_range(start, stop)
            if cache is None:
                x, _ = layers.apply(step, x)
            else:
                cache_slices = [
                    _layer_slice(part, start, stop, self.layers.num_layers)
                    for part in (cache.key, cache.value)
                ]
                x, (segment_keys, segment_values) = layers.apply(step, x, *cache_slices)
                keys.append(segment_keys)
                values.append(segment_values)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(hn.concatenate(LAYERS, keys), hn.concatenate(LAYERS, values))
        return DecoderOutput(self.norm(x), jnp.zeros((), jnp.float32), {}, new_cache)

    def complete_mask(self, mask: AttentionMask | None) -> AttentionMask:
        """``mask`` (causal by default); with `LlamaConfig.full_attention_layers` the config's window is
        added per layer by `decoder`, otherwise here (see `CausalLM.complete_mask`)."""
        if self.config.full_attention_layers == 0:
            return super().complete_mask(mask)
        return AttentionMask(causal=True) if mask is None else mask

    def _segments(self, mask: AttentionMask) -> list[tuple[int, int, AttentionMask]]:
        """``(first layer, end layer, mask)`` for each run of layers with the same window.

        A window given explicitly in ``mask`` applies to every layer; otherwise the layers from
        ``full_attention_layers`` on get the config's window.
        """
        num_layers, full = self.layers.num_layers, self.config.full_attention_layers
        if full == 0 or full == num_layers or mask.sliding_window is not None:
            return [(0, num_layers, mask)]
        windowed = dataclasses.replace(mask, sliding_window=self.config.sliding_window)
        return [(0, full, mask), (full, num_layers, windowed)]

    def _layer_range(self, start: int, stop: int) -> LayerStack:
        """Layers ``start..stop-1`` as a `LayerStack` (the stack itself when that is every layer)."""
        num_layers = self.layers.num_layers
        if (start, stop) == (0, num_layers):
            return self.layers
        sliced = jax.tree.map(
            lambda x: _layer_slice(x, start, stop, num_layers), self.layers.layers, is_leaf=hn.is_named
        )
        return LayerStack(sliced, stop - start, self.layers.scan, self.layers.remat)


def _layer_slice(x: NamedArray, start: int, stop: int, num_layers: int) -> NamedArray:
    """Layers ``start..stop-1`` of a NamedArray with a leading ``layers`` axis (itself when all)."""
    return x if (start, stop) == (0, num_layers) else x[LAYERS, start:stop]
