"""A muP decoder in the style of Mu-Transformer (relative muP, Tensor Programs V appendix B.1).

Hyperparameters tuned at the base width ``d_base`` transfer to any ``hidden_size`` because:

- ``head_dim`` and ``ff_multiple`` stay fixed while the width grows (more heads, wider MLP);
- attention logits are ``q·k * qk_scale`` with ``qk_scale = 1 / head_dim`` (not ``1/sqrt``);
- init: embeddings N(0, 1); hidden matrices N(0, 1/hidden_size) (the MLP output: N(0, 1/d_ff));
  unembedding N(0, 1/hidden_size**2) (std ``1/hidden_size``), or zero; optionally a zero query projection;
- `lr_multipliers`: every hidden matrix and the unembedding train at ``lr * d_base / hidden_size``;
  embeddings, norm gains and biases at ``lr``. The optimizer multiplies its updates by them.

Block: pre-RMSNorm attention (RoPE) and a pre-RMSNorm MLP (``relu`` by default), final RMSNorm before
the unembedding, no biases. `MupTransformer.coordinates` reports mean |activation| per layer for
coordinate checks.
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
from halyard.models.model import CausalLM, DecoderOutput, build_model, default_positions
from halyard.models.rotary import RotaryConfig
from halyard.models.stack import LayerStack
from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, Linear, RMSNorm
from halyard.shard import constrain


@register_model("mup")
@dataclasses.dataclass(frozen=True)
class MupConfig(ModelConfig):
    """The muP decoder.

    Attributes:
        vocab_size: number of token ids.
        hidden_size: model width ``d_model`` (a multiple of ``head_dim``).
        d_base: the width at which hyperparameters were tuned (learning-rate multipliers are relative to it).
        head_dim: fixed size of one head (``num_heads = hidden_size // head_dim``).
        ff_multiple: MLP width as a multiple of ``hidden_size``.
        num_layers: decoder layers.
        max_position: longest configured position (rotary).
        rope: rotary configuration.
        activation: MLP activation (``relu``; ``squared_relu``, ``gelu``, ``silu`` also work).
        norm_eps: RMSNorm epsilon.
        use_gains: learned RMSNorm gains (Mu-Transformer's default has none).
        qk_scale: attention logit scale, None for ``1 / head_dim``.
        zero_query_init: start the query projection at zero (every query attends uniformly at step 0).
        zero_unembed_init: start the unembedding at zero instead of N(0, 1/hidden_size**2).
    """

    vocab_size: int = 32000
    hidden_size: int = 1024
    d_base: int = 128
    head_dim: int = 64
    ff_multiple: int = 4
    num_layers: int = 12
    max_position: int = 2048
    rope: RotaryConfig = dataclasses.field(default_factory=lambda: RotaryConfig(theta=10000.0))
    activation: str = "relu"
    norm_eps: float = 1e-6
    use_gains: bool = False
    qk_scale: float | None = None
    zero_query_init: bool = True
    zero_unembed_init: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("vocab_size", "hidden_size", "d_base", "head_dim", "ff_multiple", "num_layers"):
            if getattr(self, field) < 1:
                raise ValueError(f"MupConfig.{field} must be positive, got {getattr(self, field)}")
        if self.hidden_size % self.head_dim != 0:
            raise ValueError(
                f"MupConfig.hidden_size={self.hidden_size} must be a multiple of head_dim={self.head_dim} "
                "(muP keeps the head size fixed and grows the number of heads)"
            )
        self.rope.check_head_size(self.head_dim, f"MupConfig.head_dim={self.head_dim}")
        check_activation(self.activation, "MupConfig.activation")

    @property
    def num_heads(self) -> int:
        """``hidden_size // head_dim``."""
        return self.hidden_size // self.head_dim

    @property
    def kv_heads(self) -> int:
        return self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim

    @property
    def mlp_size(self) -> int:
        """``ff_multiple * hidden_size``."""
        return self.ff_multiple * self.hidden_size

    @property
    def width_multiplier(self) -> float:
        """``hidden_size / d_base``: hidden learning rates are divided by it."""
        return self.hidden_size / self.d_base

    @property
    def attention_scale(self) -> float:
        """The attention logit scale in use (``qk_scale`` or ``1 / head_dim``)."""
        return self.qk_scale if self.qk_scale is not None else 1.0 / self.head_dim

    def init(self, key: jax.Array) -> MupTransformer:
        """A `MupTransformer` with muP initialisation."""
        return build_model(MupTransformer, self, key)

    def num_params(self) -> int:
        """Parameter count (untied embeddings)."""
        embed = self.hidden_size
        gains = 2 * embed if self.use_gains else 0
        per_layer = 4 * embed * embed + 2 * embed * self.mlp_size + gains
        return self.num_layers * per_layer + 2 * self.vocab_size * embed + (embed if self.use_gains else 0)

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


class MupBlock(eqx.Module):
    """One layer: pre-RMSNorm attention and MLP, each added to the residual."""

    attention_norm: RMSNorm
    attention: SelfAttention
    mlp_norm: RMSNorm
    mlp: MLP

    @classmethod
    def init(cls, config: MupConfig, *, key: jax.Array) -> MupBlock:
        """A layer with muP initialisation (see the module docstring)."""
        Embed, Mlp = Axis("embed", config.hidden_size), Axis("mlp", config.mlp_size)
        hidden_std = 1.0 / math.sqrt(config.hidden_size)
        attention_key, mlp_key = jax.random.split(key)
        attention = SelfAttention.init(
            Embed,
            num_heads=config.num_heads,
            num_kv_heads=config.num_heads,
            head_size=config.head_dim,
            key=attention_key,
            qkv_bias=False,
            out_bias=False,
            init_std=hidden_std,
            out_init_std=hidden_std,
            query_init_std=0.0 if config.zero_query_init else hidden_std,
            rope=config.rope,
            max_position=config.max_position,
            scale=config.attention_scale,
            implementation=config.attention_implementation,
            block_size=config.attention_block_size,
            dtype=config.params,
        )
        mlp = MLP.init(
            Embed, Mlp, key=mlp_key, act=config.activation, use_bias=False,
            init_std=hidden_std, down_init_std=1.0 / math.sqrt(config.mlp_size), dtype=config.params,
        )  # fmt: skip
        norm = RMSNorm.init(Embed, eps=config.norm_eps, use_weight=config.use_gains, dtype=config.params)
        return cls(norm, attention, norm, mlp)

    def __call__(
        self,
        x: NamedArray,
        mask: AttentionMask,
        positions: NamedArray,
        cache: Any = None,
        cache_index: Any = None,
    ) -> tuple[NamedArray, tuple[Any, dict[str, jax.Array]]]:
        """``x -> (x', (layer cache, mean |activation| of the attention output, MLP output and residual))``."""
        attended, cache = self.attention(self.attention_norm(x), mask, positions, cache, cache_index)
        h = constrain(x + attended)
        mlp_out = self.mlp(self.mlp_norm(h))
        out = constrain(h + mlp_out)
        coordinates = {
            "attention": jnp.mean(jnp.abs(attended.array)),
            "mlp": jnp.mean(jnp.abs(mlp_out.array)),
            "residual": jnp.mean(jnp.abs(out.array)),
        }
        return out, (cache, coordinates)


class MupTransformer(CausalLM):
    """The muP decoder.

    Attributes:
        token_embedding: ``(vocab, embed)``, N(0, 1).
        layers: stacked `MupBlock`s.
        final_norm: RMSNorm before the unembedding.
        lm_head: ``embed -> vocab`` unembedding (untied).
        config: the `MupConfig` (static).
    """

    token_embedding: Embedding
    layers: LayerStack
    final_norm: RMSNorm
    lm_head: Linear
    config: MupConfig = eqx.field(static=True)

    @classmethod
    def init(cls, config: MupConfig, *, key: jax.Array) -> MupTransformer:
        """Initialise every parameter from ``key`` with the muP rules."""
        embed_key, layers_key, head_key = jax.random.split(key, 3)
        Embed, Vocab, dtype = (
            Axis("embed", config.hidden_size),
            Axis("vocab", config.vocab_size),
            config.params,
        )
        token_embedding = Embedding.init(Vocab, Embed, key=embed_key, init_std=1.0, dtype=dtype)
        layers = LayerStack.init(
            lambda k: MupBlock.init(config, key=k), config.num_layers, key=layers_key,
            scan=config.scan_layers, remat=config.remat,
        )  # fmt: skip
        final_norm = RMSNorm.init(Embed, eps=config.norm_eps, use_weight=config.use_gains, dtype=dtype)
        unembed_std = 0.0 if config.zero_unembed_init else 1.0 / config.hidden_size
        lm_head = Linear.init(Embed, Vocab, key=head_key, use_bias=False, init_std=unembed_std, dtype=dtype)
        return cls(token_embedding, layers, final_norm, lm_head, config)

    @property
    def model_config(self) -> MupConfig:
        return self.config

    @property
    def unembedding(self) -> NamedArray:
        return self.lm_head.weight

    def _run(
        self,
        tokens: NamedArray,
        mask: AttentionMask,
        positions: NamedArray,
        cache: KVCache | None,
        cache_index: Any,
    ) -> tuple[NamedArray, dict[str, jax.Array], KVCache | None]:
        x = constrain(self.token_embedding(tokens))

        def step(layer: MupBlock, h: NamedArray, *layer_cache: NamedArray) -> tuple[NamedArray, Any]:
            return layer(h, mask, positions, tuple(layer_cache) or None, cache_index)

        if cache is None:
            x, (_, coordinates) = self.layers.apply(step, x)
            new_cache = None
        else:
            x, ((keys, values), coordinates) = self.layers.apply(step, x, cache.key, cache.value)
            new_cache = KVCache(keys, values)
        coordinates = dict(coordinates, embedding=jnp.mean(jnp.abs(self.token_embedding(tokens).array)))
        return self.final_norm(x), coordinates, new_cache

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
        hidden, _, new_cache = self._run(tokens, mask, positions, cache, cache_index)
        return DecoderOutput(hidden, jnp.zeros((), jnp.float32), {}, new_cache)

    def coordinates(self, tokens: NamedArray, *, mask: AttentionMask | None = None) -> dict[str, jax.Array]:
        """Mean |activation| for a coordinate check.

        Args:
            tokens: int ``(batch, pos)``.
            mask: attention mask (default causal).

        Returns:
            ``embedding`` (scalar), ``attention``, ``mlp`` and ``residual`` (``[num_layers]`` each: the
            attention output, MLP output and residual stream after each layer) and ``logits`` (scalar).
        """
        model = self.in_compute_dtype()
        assert isinstance(model, MupTransformer)
        hidden, coordinates, _ = model._run(
            tokens, self.complete_mask(mask), default_positions(tokens), None, None
        )
        coordinates["logits"] = jnp.mean(jnp.abs(model.logits(hidden).array))
        return coordinates


def lr_multipliers(config: MupConfig, params: Any) -> Any:
    """Per-parameter learning-rate multipliers for muP, with the structure of ``params``.

    Every hidden matrix (attention and MLP projections) and the unembedding get ``d_base / hidden_size``;
    the token embedding and norm gains get 1. The result is ``params`` with each array replaced by a
    Python float, so ``jax.tree.map(lambda update, m: update * m, updates, multipliers)`` scales an
    optimizer's updates leaf by leaf (NamedArrays line up because their array is their only leaf).

    Args:
        config: the model's `MupConfig`.
        params: a `MupTransformer` (or any pytree with its structure, e.g. its gradients).

    Raises:
        TypeError: ``params`` is not a `MupTransformer`-shaped tree.
    """
    if not isinstance(params, MupTransformer):
        raise TypeError(
            f"lr_multipliers expects a MupTransformer (or its gradients), got {type(params).__name__}"
        )
    hidden = config.d_base / config.hidden_size

    def multiplier(path: tuple[Any, ...], _: Any) -> float:
        names = [getattr(entry, "name", "") for entry in path]
        if (
            "token_embedding" in names
            or "attention_norm" in names
            or "mlp_norm" in names
            or "final_norm" in names
        ):
            return 1.0
        if "bias" in names:
            return 1.0
        return hidden

    return jax.tree_util.tree_map_with_path(multiplier, params)
