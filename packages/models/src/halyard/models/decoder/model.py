"""`Decoder`: the one decoder skeleton every family runs.

x = embed(tokens) * embedding_scale (+ position_embedding(positions))
x = layers(x)                 # a scan (or an unrolled loop) over `DecoderBlock`s, remat per layer
logits = softcap(final_norm(x) · W_out)       # W_out = the embedding when tied

Layers that differ by their `LayerKind` (window, rotary setting) stay one stacked parameter tree; the
stack scans them in groups of one repeating pattern (`halyard.named.nn.Stacked.scan` with ``kinds``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.models.attention import AttentionMask
from halyard.models.attention.dispatch import paged_kernel
from halyard.models.decoder.block import DecoderBlock, Norm, make_norm
from halyard.models.decoder.pipeline import PipelineSchedule, pipeline_stages, run_pipelined
from halyard.models.decoder.spec import DecoderSpec
from halyard.models.layers.moe import load_balancing_loss, router_z_loss
from halyard.models.layers.paged_kv import PagedKV
from halyard.models.model import CausalLM, DecoderOutput, default_positions
from halyard.named import Axis, NamedArray
from halyard.named.nn import Embedding, Linear, Stacked
from halyard.shard import constrain

LAYERS = "layers"


class Decoder(CausalLM):
    """A decoder-only transformer described by a family's config (a `DecoderConfig`, read as its `DecoderSpec`).

    Attributes:
        embed: token embedding ``(vocab, embed)``.
        position_embedding: learned ``(position, embed)`` table (GPT-2), or None.
        layers: the `DecoderBlock`s, stacked on a ``layers`` axis.
        final_norm: the norm before the output projection.
        lm_head: ``embed -> vocab``, None when the embeddings are tied.
        config: the family config (static).
    """

    embed: Embedding
    position_embedding: Embedding | None
    layers: Stacked[DecoderBlock]
    final_norm: Norm
    lm_head: Linear | None
    config: DecoderSpec = eqx.field(static=True)
    decoder_takes_token_mask: ClassVar[bool] = True

    @classmethod
    def init(cls, config: DecoderSpec, *, key: jax.Array) -> Decoder:
        """Initialise every parameter from ``key`` (the family's stds; norms at one, biases at zero)."""
        shape, dtype = config.shape, config.params
        embed_key, position_key, layers_key, head_key = jax.random.split(key, 4)
        Embed, Vocab = Axis("embed", shape.embed), Axis("vocab", shape.vocab)
        embed = Embedding.init(Vocab, Embed, key=embed_key, init_std=config.embed_init_std, dtype=dtype)
        position_embedding = None
        if shape.learned_positions:
            Position = Axis("position", shape.max_position)
            position_embedding = Embedding.init(
                Position, Embed, key=position_key, init_std=config.embed_init_std, dtype=dtype
            )
        layers = Stacked.init(
            Axis(LAYERS, shape.layers), DecoderBlock, config, key=layers_key, remat=config.remat
        )
        lm_head = None
        if not shape.tie_embeddings:
            lm_head = Linear.init(
                Embed, Vocab, key=head_key, use_bias=False, init_std=config.lm_head_init_std, dtype=dtype
            )
        final_norm = make_norm(config.layout(), Embed, dtype)
        return cls(embed, position_embedding, layers, final_norm, lm_head, config)

    @property
    def model_config(self) -> DecoderSpec:
        return self.config

    @property
    def unembedding(self) -> NamedArray:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @property
    def position_limit(self) -> int | None:
        return self.config.shape.max_position if self.position_embedding is not None else None

    @property
    def logit_softcap(self) -> float | None:
        return self.config.final_logit_softcap

    def init_pages(self, num_pages: int, page_size: int, implementation: str = "auto") -> PagedKV:
        """An empty pool of ``num_pages`` pages of ``page_size`` tokens for every layer (compute dtype), laid
        out for the paged kernel ``implementation`` (`halyard.models.attention.dispatch.paged_kernel`)."""
        shape = self.config.shape
        return PagedKV.zeros(
            kernel=paged_kernel(implementation),
            num_layers=shape.layers,
            num_pages=num_pages,
            page_size=page_size,
            num_kv_heads=shape.kv_heads,
            head_size=shape.head_size,
            dtype=self.config.compute,
        )

    def decoder(
        self,
        tokens: NamedArray,
        *,
        mask: AttentionMask,
        positions: NamedArray,
        cache: PagedKV | None = None,
        token_mask: NamedArray | None = None,
    ) -> DecoderOutput:
        """See `CausalLM.decoder`; MoE families add the weighted router losses to ``aux_loss``.

        Args:
            token_mask: 0/1 per token ``(batch..., pos)``: router statistics are means over the tokens
                where it is 1 (`CausalLM.loss` passes the loss mask); None counts every token.

        Raises:
            ValueError: a sequence longer than a learned position table.
        """
        # An engine's paged cache checks positions against `position_limit` before it runs.
        if self.position_embedding is not None and cache is None:
            length = tokens.axis_size("pos")
            limit = self.config.shape.max_position
            if length > limit:
                raise ValueError(
                    f"{type(self.config).__name__} has {limit} learned positions but got a sequence of "
                    f"{length}; use shorter windows or a config with a larger max_position"
                )
        x = self.embed(tokens)
        scale = self.config.embedding_scale
        if scale != 1.0:
            x = x * jnp.asarray(scale, x.dtype)  # in the activation dtype, as Hugging Face's Gemma does
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions)
        cache_args: tuple = () if cache is None else (cache.for_layer_scan(),)
        carry: Any = constrain(x) if cache is None else (constrain(x), cache.pool)
        if cache is None and (stages := pipeline_stages()) > 1:
            config = self.config
            schedule = PipelineSchedule(stages, config.pipeline_repeats, config.pipeline_microbatches)
            x, layer_stats = run_pipelined(
                self.layers,
                constrain(x),
                (mask, positions),
                {"token_mask": token_mask},
                schedule=schedule,
                kinds=config.layer_kinds(),
                unroll=not config.scan_layers,
            )
            new_cache: Any = None
        else:
            carry, (_, layer_stats) = self.layers.scan(
                carry,
                mask,
                positions,
                *cache_args,
                kinds=self.config.layer_kinds(),
                unroll=not self.config.scan_layers,
                token_mask=token_mask,
            )
            x, new_cache = (carry, None) if cache is None else (carry[0], cache.with_pool(carry[1]))
        aux, metrics = jnp.zeros((), jnp.float32), {}
        if self.config.layout().mlp == "moe":
            balance, z_loss = load_balancing_loss(layer_stats), router_z_loss(layer_stats)
            coefficients = self.config.router_loss_weights()
            aux = coefficients[0] * balance + coefficients[1] * z_loss
            metrics = {"load_balancing_loss": balance, "router_z_loss": z_loss}
        return DecoderOutput(self.final_norm(x), aux, metrics, new_cache, layer_stats)

    def coordinates(self, tokens: NamedArray, *, mask: AttentionMask | None = None) -> dict[str, jax.Array]:
        """Mean |activation| for a coordinate check (families whose layout reports coordinates: muP).

        Returns:
            ``embedding`` (scalar), ``attention``, ``mlp`` and ``residual`` (``[num_layers]`` each) and
            ``logits`` (scalar).

        Raises:
            ValueError: the family's layout does not report coordinates.
        """
        if not self.config.layout().report_coordinates:
            raise ValueError(f"{type(self.config).__name__} does not report coordinates (a muP family does)")
        model = self.in_compute_dtype()
        assert isinstance(model, Decoder)
        output = model.decoder(tokens, mask=self.complete_mask(mask), positions=default_positions(tokens))
        coordinates = dict(output.layer_stats, embedding=jnp.mean(jnp.abs(model.embed(tokens).array)))
        coordinates["logits"] = jnp.mean(jnp.abs(model.logits(output.hidden).array))
        return coordinates
