"""GPT-2: learned absolute positions, LayerNorm, GELU (tanh) MLP, biases everywhere, tied embeddings.

x = wte[tokens] + wpe[positions]
h = x + Attention(LayerNorm(x))
y = h + MLP(LayerNorm(h))
logits = LayerNorm(y_L) · wte
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.attention import AttentionMask
from halyard.models.config import ModelConfig, register_model
from halyard.models.flops import decoder_flops_per_token
from halyard.models.layers.activations import check_activation
from halyard.models.layers.kv_cache import KVCache
from halyard.models.layers.mlp import MLP
from halyard.models.layers.self_attention import SelfAttention
from halyard.models.model import CausalLM, DecoderOutput, build_model
from halyard.models.stack import LayerStack
from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, LayerNorm
from halyard.shard import constrain


@register_model("gpt2")
@dataclasses.dataclass(frozen=True)
class Gpt2Config(ModelConfig):
    """GPT-2 (defaults: the 124M model).

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width (``embed``); num_heads divides it.
        num_layers: decoder layers.
        num_heads: attention heads (head size ``hidden_size // num_heads``).
        intermediate_size: MLP width; None means ``4 * hidden_size``.
        max_position: number of learned positions.
        layer_norm_eps: LayerNorm epsilon.
        activation: MLP activation (``gelu_new``, the tanh approximation).
        initializer_range: weight std at init; residual projections use it / sqrt(2 * num_layers).
    """

    vocab_size: int = 50257
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int | None = None
    max_position: int = 1024
    layer_norm_eps: float = 1e-5
    activation: str = "gelu_new"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position"):
            if getattr(self, field) < 1:
                raise ValueError(f"Gpt2Config.{field} must be positive, got {getattr(self, field)}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"Gpt2Config.hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        check_activation(self.activation, "Gpt2Config.activation")

    @property
    def mlp_size(self) -> int:
        """MLP width."""
        return self.intermediate_size if self.intermediate_size is not None else 4 * self.hidden_size

    @property
    def head_size(self) -> int:
        """Size of one attention head."""
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads (GPT-2 has plain multi-head attention)."""
        return self.num_heads

    def init(self, key: jax.Array) -> Gpt2:
        """A `Gpt2` initialised as in Hugging Face (scaled residual projections)."""
        return build_model(Gpt2, self, key)

    def num_params(self) -> int:
        """Parameter count (the output projection is the token embedding)."""
        embed, mlp = self.hidden_size, self.mlp_size
        attention = 4 * embed * embed + 4 * embed
        per_layer = attention + 2 * embed * mlp + mlp + embed + 4 * embed
        return self.num_layers * per_layer + (self.vocab_size + self.max_position) * embed + 2 * embed

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward); see `halyard.models.flops`."""
        return decoder_flops_per_token(
            matmul_params_per_layer=4 * self.hidden_size**2 + 2 * self.hidden_size * self.mlp_size,
            num_layers=self.num_layers,
            attention_width=self.hidden_size,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            seq_len=seq_len,
        )


class Gpt2Block(eqx.Module):
    """One GPT-2 layer: pre-LayerNorm attention and MLP, each added to the residual."""

    ln_1: LayerNorm
    attention: SelfAttention
    ln_2: LayerNorm
    mlp: MLP

    @classmethod
    def init(cls, config: Gpt2Config, *, key: jax.Array) -> Gpt2Block:
        """A layer; residual projections get std ``initializer_range / sqrt(2 * num_layers)``."""
        Embed, Mlp = Axis("embed", config.hidden_size), Axis("mlp", config.mlp_size)
        std = config.initializer_range
        residual_std = std / math.sqrt(2 * config.num_layers)
        attention_key, mlp_key = jax.random.split(key)
        dtype = config.params
        attention = SelfAttention.init(
            Embed,
            num_heads=config.num_heads,
            num_kv_heads=config.num_heads,
            head_size=config.head_size,
            key=attention_key,
            qkv_bias=True,
            out_bias=True,
            init_std=std,
            out_init_std=residual_std,
            rope=None,
            max_position=config.max_position,
            implementation=config.attention_implementation,
            block_size=config.attention_block_size,
            dtype=dtype,
        )
        mlp = MLP.init(
            Embed, Mlp, key=mlp_key, act=config.activation, use_bias=True,
            init_std=std, down_init_std=residual_std, dtype=dtype,
        )  # fmt: skip
        norm = LayerNorm.init(Embed, eps=config.layer_norm_eps, dtype=dtype)
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
        attended, cache = self.attention(self.ln_1(x), mask, positions, cache, cache_index)
        h = constrain(x + attended)
        return constrain(h + self.mlp(self.ln_2(h))), cache


class Gpt2(CausalLM):
    """The GPT-2 decoder.

    Attributes:
        token_embedding: ``(vocab, embed)``, also the output projection.
        position_embedding: ``(position, embed)`` learned positions.
        layers: stacked `Gpt2Block`s.
        ln_f: final LayerNorm.
        config: the `Gpt2Config` (static).
    """

    token_embedding: Embedding
    position_embedding: Embedding
    layers: LayerStack
    ln_f: LayerNorm
    config: Gpt2Config = eqx.field(static=True)

    @classmethod
    def init(cls, config: Gpt2Config, *, key: jax.Array) -> Gpt2:
        """Initialise every parameter from ``key``."""
        token_key, position_key, layers_key = jax.random.split(key, 3)
        Embed, dtype = Axis("embed", config.hidden_size), config.params
        std = config.initializer_range
        token_embedding = Embedding.init(
            Axis("vocab", config.vocab_size), Embed, key=token_key, init_std=std, dtype=dtype
        )
        position_embedding = Embedding.init(
            Axis("position", config.max_position), Embed, key=position_key, init_std=std, dtype=dtype
        )
        layers = LayerStack.init(
            lambda k: Gpt2Block.init(config, key=k), config.num_layers, key=layers_key,
            scan=config.scan_layers, remat=config.remat,
        )  # fmt: skip
        ln_f = LayerNorm.init(Embed, eps=config.layer_norm_eps, dtype=dtype)
        return cls(token_embedding, position_embedding, layers, ln_f, config)

    @property
    def model_config(self) -> Gpt2Config:
        return self.config

    @property
    def position_limit(self) -> int:
        return self.config.max_position

    @property
    def unembedding(self) -> NamedArray:
        return self.token_embedding.weight

    def decoder(
        self,
        tokens: NamedArray,
        *,
        mask: AttentionMask,
        positions: NamedArray,
        cache: KVCache | None = None,
        cache_index: Any = None,
    ) -> DecoderOutput:
        """See `CausalLM.decoder`; positions index the learned position table.

        Raises:
            ValueError: the sequence is longer than the ``max_position`` learned positions.
        """
        length = tokens.axis_size("pos") if cache is None else cache.max_length
        if length > self.config.max_position:
            raise ValueError(
                f"GPT-2 has {self.config.max_position} learned positions but got a sequence of {length}; "
                "use shorter windows or a config with a larger max_position"
            )
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = constrain(x)

        def step(layer: Gpt2Block, h: NamedArray, *layer_cache: NamedArray) -> tuple[NamedArray, Any]:
            return layer(h, mask, positions, tuple(layer_cache) or None, cache_index)

        if cache is None:
            x, _ = self.layers.apply(step, x)
            new_cache = None
        else:
            x, (keys, values) = self.layers.apply(step, x, cache.key, cache.value)
            new_cache = KVCache(keys, values)
        return DecoderOutput(self.ln_f(x), jnp.zeros((), jnp.float32), {}, new_cache)
