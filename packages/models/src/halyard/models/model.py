"""`CausalLM`: the interface every family implements (forward to logits, loss, incremental decode).

A family provides `CausalLM.decoder` (token ids -> final hidden states, plus auxiliary losses and the
updated KV cache) and `CausalLM.unembedding` (the ``(vocab, embed)`` output matrix). The rest is shared:

- ``model(tokens, mask=..., positions=...)`` returns float32 logits ``(batch, pos, vocab)``;
- ``model.loss(batch)`` computes next-token cross-entropy in vocabulary blocks (full logits never
  materialised) plus the family's auxiliary losses (MoE load balancing, router z-loss);
- ``model.paged_step(...)`` runs new tokens against an inference engine's `PagedKV` (`halyard.serve`).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

import halyard.named as hn
from halyard.models.attention import AttentionMask
from halyard.models.batch import LmBatch
from halyard.models.context_order import balanced_batch
from halyard.models.layers.paged_kv import PagedKV
from halyard.models.loss import next_token_loss
from halyard.models.reports import report_logits_max
from halyard.named import NamedArray
from halyard.named.nn import gemm_dot_general, invariant_rows


class DecoderOutput(NamedTuple):
    """What `CausalLM.decoder` returns.

    Attributes:
        hidden: final hidden states ``(batch..., pos, embed)`` (after the last norm).
        aux_loss: scalar added to the training loss (0.0 for dense families).
        metrics: scalars to report (e.g. ``load_balancing_loss``).
        cache: with a `PagedKV`, the pool with this call's keys and values of every layer stored; None
            without one.
        layer_stats: what each layer reported, stacked on ``layers`` (MoE router statistics, muP
            coordinates), or None.
    """

    hidden: NamedArray
    aux_loss: jax.Array
    metrics: dict[str, jax.Array]
    cache: PagedKV | None
    layer_stats: Any = None


def default_positions(tokens: NamedArray) -> NamedArray:
    """``0, 1, ..., len(pos) - 1`` for every row of ``tokens`` (axes of ``tokens``)."""
    arange = NamedArray(jnp.arange(tokens.axis_size("pos"), dtype=jnp.int32), (tokens.axis("pos"),))
    return hn.broadcast_to(arange, tokens.axes)


def _plain(x: Any) -> jax.Array:
    """A scalar as a plain ``jax.Array`` (the loss helpers return 0-d NamedArrays)."""
    return x.array if isinstance(x, NamedArray) else jnp.asarray(x)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with every floating array (plain or named) cast to ``dtype``; other leaves unchanged."""

    def cast(x: Any) -> Any:
        if isinstance(x, NamedArray) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree, is_leaf=hn.is_named)


class CausalLM(eqx.Module):
    """A decoder-only language model over named axes (``batch``, ``pos``, ``embed``, ``vocab``...).

    Attributes:
        decoder_takes_token_mask: whether the family's `decoder` accepts ``token_mask`` (0/1 per token,
            ``(batch..., pos)``) for statistics that average over tokens (MoE router losses); `loss` then
            passes the batch's loss mask, so padding and loss-masked positions do not count in them.
    """

    decoder_takes_token_mask: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def model_config(self) -> Any:
        """The family config this model was built from."""

    @abc.abstractmethod
    def decoder(
        self,
        tokens: NamedArray,
        *,
        mask: AttentionMask,
        positions: NamedArray,
        cache: PagedKV | None = None,
    ) -> DecoderOutput:
        """Token ids ``(batch, pos)`` to final hidden states; see `DecoderOutput`.

        Args:
            tokens: int token ids ``(batch..., pos)``.
            mask: the attention mask, as `complete_mask` completes it.
            positions: position of each token ``(batch..., pos)`` (rotary / learned positions).
            cache: an inference engine's `PagedKV` to read and extend, or None.
        """

    @property
    @abc.abstractmethod
    def unembedding(self) -> NamedArray:
        """The output matrix with axes ``vocab`` and ``embed`` (the input embedding when tied)."""

    @property
    def position_limit(self) -> int | None:
        """The number of positions the model can represent (learned position tables), None if unbounded."""
        return None

    @property
    def logit_softcap(self) -> float | None:
        """``cap * tanh(logits / cap)`` on the output logits (Gemma 2), or None."""
        return None

    # -- shared behaviour ---------------------------------------------------------------------------
    def complete_mask(self, mask: AttentionMask | None) -> AttentionMask:
        """``mask``, causal by default (each layer adds its own window unless the mask has one)."""
        return AttentionMask(causal=True) if mask is None else mask

    def in_compute_dtype(self) -> CausalLM:
        """This model with floating parameters cast to the config's compute dtype (for mixed precision)."""
        config = self.model_config
        if config.compute_dtype is None or jnp.dtype(config.compute_dtype) == jnp.dtype(config.param_dtype):
            return self
        return cast_floating(self, jnp.dtype(config.compute_dtype))

    def __call__(
        self,
        tokens: NamedArray,
        *,
        mask: AttentionMask | None = None,
        positions: NamedArray | None = None,
        key: jax.Array | None = None,
    ) -> NamedArray:
        """Logits for every position.

        Args:
            tokens: int token ids ``(batch..., pos)``.
            mask: attention mask (default: causal); each layer adds its own window.
            positions: ``(batch..., pos)`` positions, default ``arange`` per row.
            key: randomness for stochastic layers; the current families have none (no dropout), so it
                is accepted for interface stability and unused.

        Returns:
            float32 logits ``(batch..., pos, vocab)``.
        """
        model = self.in_compute_dtype()
        positions = default_positions(tokens) if positions is None else positions
        output = model.decoder(tokens, mask=self.complete_mask(mask), positions=positions)
        return model.logits(output.hidden)

    def logits(self, hidden: NamedArray) -> NamedArray:
        """float32 logits ``(batch..., pos, vocab)`` from final hidden states."""
        logits = unembed(hidden, self.unembedding.astype(hidden.dtype)).astype(jnp.float32)
        cap = self.logit_softcap
        return logits if cap is None else hn.tanh(logits / cap) * cap

    def loss(
        self,
        batch: LmBatch,
        *,
        key: jax.Array | None = None,
        z_loss_weight: float = 0.0,
        reduction: str = "mean",
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Next-token loss of ``batch`` (see `LmBatch` for the convention) plus auxiliary losses.

        Args:
            batch: tokens, labels, positions, segment ids and loss mask.
            key: unused (no dropout in the current families); kept for interface stability.
            z_loss_weight: weight of ``logsumexp(logits)**2`` (PaLM's z-loss); 0 disables it.
            reduction: ``"mean"`` over unmasked tokens or ``"sum"`` (for token-weighted accumulation).

        Returns:
            ``(loss, metrics)``; metrics hold ``cross_entropy``, ``z_loss``, ``num_tokens`` and the
            family's auxiliary terms (``load_balancing_loss``, ``router_z_loss`` for MoE).
        """
        model = self.in_compute_dtype()
        # Under context parallelism the positions are taken in the load-balanced order (context_order);
        # the mask then reads each token's window index.
        batch, window = balanced_batch(batch)
        mask = self.complete_mask(
            AttentionMask(
                causal=True,
                segment_ids=batch.segment_ids,
                query_positions=window,
                key_positions=None if window is None else window.rename({"pos": "key_pos"}),
            )
        )
        token_mask: dict[str, Any] = {"token_mask": batch.loss_mask} if self.decoder_takes_token_mask else {}
        softcap: dict[str, Any] = {} if self.logit_softcap is None else {"logit_softcap": self.logit_softcap}
        output = model.decoder(batch.tokens, mask=mask, positions=batch.positions, **token_mask)
        report_logits_max(output.hidden, model.unembedding, batch.loss_mask)  # when a step collects
        cross_entropy, loss_metrics = next_token_loss(
            output.hidden,
            model.unembedding.astype(output.hidden.dtype),
            batch.labels,
            loss_mask=batch.loss_mask,
            block_size=self.model_config.loss_block_size,
            full_logits_max_bytes=self.model_config.loss_full_logits_max_mib * 2**20,
            z_loss_weight=z_loss_weight,
            reduction=reduction,
            **softcap,
        )
        metrics: dict[str, jax.Array] = {name: _plain(value) for name, value in loss_metrics.items()}
        metrics.update(output.metrics)
        # A summed loss is divided by the token count later (token-weighted accumulation): scale the
        # auxiliary term so that the division gives back mean + aux.
        aux = output.aux_loss * metrics["num_tokens"] if reduction == "sum" else output.aux_loss
        return _plain(cross_entropy) + aux, metrics

    def paged_step(self, tokens: NamedArray, *, pages: PagedKV) -> tuple[NamedArray, PagedKV]:
        """Run one inference engine step: a flat batch of tokens of many sequences against their pages.

        Each token attends to every earlier position of its sequence (read from ``pages``, the step's own
        keys included), with the same key blocks and the same per-block arithmetic as a forward pass over
        the whole sequence (`halyard.models.attention.paged`).

        Args:
            tokens: int ``(pos,)``: the step's tokens, sequence after sequence, padding last
                (`halyard.models.attention.ragged_paged`).
            pages: the pool with the step's layout (`PagedKV.for_step`).

        Returns:
            ``(final hidden states (pos, embed), the pool with the step's keys and values stored)``: in a
            program to which the pool is donated, stored in place.
        """
        if pages.batch is None:
            raise ValueError("paged_step: the pool has no step layout; call pages.for_step(batch) first")
        model = self.in_compute_dtype()
        positions = NamedArray(jnp.maximum(pages.batch.positions, 0), tokens.axes)  # padding: rotary at 0
        mask = AttentionMask(causal=True)
        output = model.decoder(tokens, mask=self.complete_mask(mask), positions=positions, cache=pages)
        if output.cache is None:
            raise RuntimeError(f"{type(self).__name__}.decoder returned no pool although pages were given")
        return output.hidden, output.cache

    def init_pages(self, num_pages: int, page_size: int, implementation: str = "auto") -> PagedKV:
        """An empty pool of ``num_pages`` pages of ``page_size`` tokens for every layer (compute dtype), for
        the paged kernel ``implementation``."""
        raise NotImplementedError(f"{type(self).__name__} has no paged KV cache")


def unembed(hidden: NamedArray, unembedding: NamedArray) -> NamedArray:
    """``hidden · unembedding`` over ``embed`` in ``hidden``'s dtype: the output head's product (``vocab`` last).

    Inside `halyard.named.nn.batch_invariant` the product runs in fixed blocks of rows, as `Linear`'s.

    Args:
        hidden: final hidden states with an ``embed`` axis.
        unembedding: ``vocab`` x ``embed`` (either order), already in the product's dtype.
    """
    if invariant_rows() is None:
        return hn.dot(hidden, unembedding, axis="embed")
    ordered = hidden.rearrange(..., "embed")
    weight = unembedding.rearrange("embed", "vocab")
    # a tied unembedding is the embedding transposed: materialised here, or XLA folds the transpose into the
    # product, one way in the engine's step and another in the training step
    matrix = jax.lax.optimization_barrier(weight.array)
    product = gemm_dot_general(ordered.array, matrix, (((ordered.ndim - 1,), (0,)), ((), ())))
    return NamedArray(product, (*ordered.axes[:-1], weight.axes[1]))
