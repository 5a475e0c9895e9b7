"""The training state and the one compiled train step (gradient accumulation, NaN policy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from halyard.named import capture_reports, collect_reports
from halyard.train.invariant.norms import canonical_norm
from halyard.train.invariant.slices import CanonicalSlices, sliced_value_and_grad
from halyard.train.invariant.update import clip_to_norm, isolated
from halyard.train.watch.config import WatchConfig
from halyard.train.watch.norms import histograms, module_norms, optimizer_state_norms, top_names

# loss_fn(params, batch, key) -> (loss_sum, stats). ``loss_sum`` is the *sum* of per-token losses of the
# batch and ``stats["num_tokens"]`` the number of tokens it was summed over; every other stat is a sum
# too. Sums (not means) make accumulated gradients exactly the token mean over the whole batch.
LossFn = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]

EXAMPLE_STATS = {"example_loss": "loss", "example_tokens": "tokens"}
"""Stats of ``loss_fn`` given per example (``[rows]``: each row's loss sum and its counted tokens) instead of
summed: the step returns them in the batch's row order as ``metrics["examples"]["loss"]`` / ``["tokens"]``."""

PLAIN_STATS = ("domain_weights", "excess_loss")
"""Stats of ``loss_fn`` that are not token sums (a DoReMi proxy's per-domain figures of the step, with
``trainer.accumulation`` 1): in the metrics as they are, not divided by ``num_tokens``."""


class TrainState(eqx.Module):
    """Everything a step changes: the step count, parameters, optimizer state and the RNG key.

    ``key`` is raw key data (uint32), so checkpoints hold plain arrays. ``nonfinite_steps`` counts
    updates skipped because the loss or the gradients were not finite.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    key: jax.Array
    nonfinite_steps: jax.Array


def init_state(params: Any, optimizer: optax.GradientTransformation, key: jax.Array) -> TrainState:
    """A step-0 state for ``params`` (already in the parameter dtype)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        key=key,
        nonfinite_steps=jnp.zeros((), jnp.int32),
    )


def split_microbatches(batch: dict[str, jax.Array], accumulation: int) -> dict[str, jax.Array]:
    """``[B, ...] -> [accumulation, B / accumulation, ...]``, microbatch ``i`` taking rows ``i::accumulation``.

    Strided rows keep each device's rows on that device when the batch is sharded in contiguous
    blocks (each block of ``B / devices`` rows holds an equal share of every microbatch).
    """

    def split(x: jax.Array) -> jax.Array:
        rows = x.shape[0]
        if rows % accumulation:
            raise ValueError(
                f"batch of {rows} rows does not split into trainer.accumulation={accumulation} microbatches"
            )
        x = x.reshape((rows // accumulation, accumulation) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree_util.tree_map(split, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    accumulation: int = 1,
    learning_rate: Callable[[jax.Array], jax.Array] | None = None,
    skip_nonfinite: bool = True,
    microbatch_sharding: Any = None,
    join: Callable[[Any, Any], Any] | None = None,
    invariant: CanonicalSlices | None = None,
    watch: WatchConfig | None = None,
    check_update_first: bool = False,
) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
    """Build ``train_step(state, batch, frozen=None) -> (state, metrics)``; jit it with the state donated.

    Args:
        loss_fn: see `LossFn`; called with the parameters as stored.
        optimizer: an optax transformation (clipping, schedules and masks live inside it).
        accumulation: microbatches per step; the gradient equals the full batch's token mean.
        learning_rate: the optimizer's schedule, only to report the rate the update applied, read at the
            optimizer's own count (`schedule_count`), which stays behind the step after skipped steps.
        skip_nonfinite: when the loss, gradient norm or update norm is NaN/Inf, keep the old parameters and optimizer
            state and count the step in ``nonfinite_steps`` (the step number still advances, so the data
            order stays a function of the step).
        microbatch_sharding: optional sharding (a pytree matching one microbatch) to keep rows in place.
        join: ``(frozen, params) -> model`` when only part of the model trains (LoRA adapters): ``loss_fn`` gets
            ``join(frozen, state.params)``, ``frozen`` (the step's third argument) neither differentiated nor
            updated: gradients, optimizer state, ``param_norm`` and ``update_norm`` are ``state.params``' alone.
        invariant: canonical slices and norms (`halyard.train.invariant`): the same bits on any replica/data/
            fsdp split; the step clips to ``invariant.max_grad_norm`` (the optimizer must not clip).
        watch: the watched step's statistics (`halyard.train.watch`); None: the plain step.
        check_update_first: with ``skip_nonfinite``, compute the update first only for its norm (the skip), then
            again inside a conditional that writes over the donated old state: no second copy of the optimizer
            state at the peak, for one more read of gradients, state and parameters (elementwise optimizers).

    Precision is the model's (`CausalLM.in_compute_dtype`): gradients come back in each parameter's dtype.
    An ``optax.GradientTransformationExtraArgs`` also receives ``loss_fn=``, the token-mean loss of the first
    microbatch as a function of the parameters (Sophia-H's Hessian estimate).

    Metrics: ``loss`` (token mean), ``num_tokens``, ``grad_norm`` (before clipping), ``param_norm``,
    ``update_norm``, ``learning_rate``, ``nonfinite`` (1 when the update was skipped), and the token
    means of the other stats of ``loss_fn``, in float32; `_watched` adds ``examples`` and ``watch``'s statistics.
    """

    gradients = _Gradients(loss_fn, join, accumulation, microbatch_sharding, invariant)

    def train_step(
        state: TrainState, batch: dict[str, jax.Array], frozen: Any = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
        loss_key, optimizer_key = jax.random.split(key)
        grad_sums, loss_sum, stats, examples = gradients.sums(state.params, batch, loss_key, frozen)
        num_tokens = jnp.maximum(stats["num_tokens"].astype(jnp.float32), 1.0)
        grads = _token_means(grad_sums, num_tokens, isolate=invariant is not None)
        extra = {}
        if isinstance(optimizer, optax.GradientTransformationExtraArgs):
            extra["loss_fn"] = gradients.first_microbatch_loss(batch, optimizer_key, frozen)
        params, opt_state, update = _update(
            optimizer,
            grads,
            state,
            loss_sum / num_tokens,
            extra,
            skip_nonfinite,
            invariant,
            check_update_first,
        )
        metrics = {
            "loss": update.pop("loss"),
            "num_tokens": stats["num_tokens"].astype(jnp.float32),
            **update,
        }
        metrics.update(_stat_metrics(stats, num_tokens))
        if learning_rate is not None:  # the rate this update applied: the schedule at the optimizer's count
            applied_at = schedule_count(state.opt_state, default=state.step)
            metrics["learning_rate"] = jnp.asarray(learning_rate(applied_at), jnp.float32)
        new_state = _advanced(state, params, opt_state, metrics["nonfinite"])
        return new_state, _finished(metrics, _watched(watch, state, new_state, grads, examples))

    return _collecting(train_step) if watch is not None and watch.model else train_step


def _advanced(state: TrainState, params: Any, opt_state: Any, nonfinite: jax.Array) -> TrainState:
    """``state`` one step on, with the new parameters and optimizer state (the old ones when ``nonfinite``)."""
    return TrainState(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        key=state.key,
        nonfinite_steps=state.nonfinite_steps + nonfinite,
    )


def _stat_metrics(stats: dict[str, jax.Array], num_tokens: jax.Array) -> dict[str, jax.Array]:
    """The stats of ``loss_fn`` (but ``num_tokens``) as metrics: token means, `PLAIN_STATS` as they are."""
    return {
        name: value if name in PLAIN_STATS else value / num_tokens
        for name, value in stats.items()
        if name != "num_tokens"
    }


def _collecting(
    train_step: Callable[..., tuple[TrainState, dict[str, Any]]],
) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
    """``train_step`` collecting what the model reports (`halyard.named.report`) into ``metrics["watch"]``."""

    def watched_step(
        state: TrainState, batch: dict[str, jax.Array], frozen: Any = None
    ) -> tuple[TrainState, dict[str, Any]]:
        (new_state, metrics), reports = collect_reports(train_step)(state, batch, frozen)
        metrics["watch"].update(reports.finished())
        return new_state, metrics

    return watched_step


def _finished(metrics: dict[str, Any], statistics: dict[str, Any]) -> dict[str, Any]:
    """The step's metrics and statistics, every floating value float32."""
    return jax.tree_util.tree_map(_float32_if_floating, {**metrics, **statistics})


def _watched(
    watch: WatchConfig | None,
    before: TrainState,
    after: TrainState,
    grads: Any,
    examples: dict[str, jax.Array],
) -> dict[str, Any]:
    """The metrics beside the loss: ``examples`` (``{"loss": [rows], "tokens": [rows]}``, from the per-example
    stats) and, for the watched step, statistics of the gradients (before clipping), the new parameters, their
    change and the optimizer state: ``watch`` (``{name: value}``) and ``histograms`` (``{name: {"counts",
    "edges"}}``)."""
    result: dict[str, Any] = {}
    if examples:
        result["examples"] = {EXAMPLE_STATS[name]: value for name, value in examples.items()}
    if watch is None:
        return result
    watched: dict[str, Any] = {}
    if watch.norms:
        change = jax.tree_util.tree_map(
            lambda new, old: new.astype(jnp.float32) - old.astype(jnp.float32), after.params, before.params
        )
        watched.update(module_norms(grads, "grad_norm"))
        watched.update(module_norms(after.params, "param_norm"))
        watched.update(module_norms(change, "update_norm"))
        watched.update(optimizer_state_norms(after.opt_state, top_names(after.params)))
    result["watch"] = watched
    if watch.histograms:
        bins = watch.histogram_bins
        result["histograms"] = {**histograms(after.params, "param", bins), **histograms(grads, "grad", bins)}
    return result


def _token_means(grad_sums: Any, num_tokens: jax.Array, *, isolate: bool) -> Any:
    """The gradient sums divided by the token count, each in its dtype; with ``isolate`` behind a barrier.

    XLA's simplifier may fold the division into the clipping and the update that follow (such as
    ``A / B / C -> A / (B * C)``), differently in an FSDP shard's program and a whole leaf's: without the
    barrier an invariant fsdp-8 step parted from 1 device's; with it every mesh computes what is written.
    """
    grads = jax.tree_util.tree_map(lambda g: (g / num_tokens).astype(g.dtype), grad_sums)
    return jax.lax.optimization_barrier(grads) if isolate else grads


def _update(
    optimizer: optax.GradientTransformation,
    grads: Any,
    state: TrainState,
    loss: jax.Array,
    extra: dict[str, Any],
    skip_nonfinite: bool,
    invariant: CanonicalSlices | None = None,
    check_update_first: bool = False,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``(params, optimizer state, metrics)`` after the optimizer's update of ``state`` by ``grads``; with
    ``skip_nonfinite`` a non-finite loss, gradient or update keeps the old parameters and optimizer state;
    ``check_update_first`` decides that from a first pass that computes the update's norm alone (see `make_train_step`).
    With ``invariant`` every norm is `canonical_norm`, ``grads`` are clipped to ``invariant.max_grad_norm`` and the
    update is `isolated` (it runs where the weights are, with the same bits on any sharding)."""
    norm = optax.tree.norm if invariant is None else lambda tree: canonical_norm(tree, invariant)
    grad_norm = norm(grads)
    if invariant is not None and invariant.max_grad_norm is not None:
        grads = clip_to_norm(grads, grad_norm, invariant.max_grad_norm)

    def apply(grads: Any, opt_state: Any, params: Any) -> tuple[Any, Any, Any]:
        updates, opt_state = optimizer.update(grads, opt_state, params, **extra)
        return optax.apply_updates(params, updates), opt_state, updates

    if invariant is not None:
        apply = isolated(apply)
    if skip_nonfinite and check_update_first:
        # The first pass computes the update for its norm alone (XLA fuses it into the norm's reductions); the
        # second runs only for a finite step, in a branch of its own, where each new leaf overwrites its old,
        # donated buffer. A `where` after the update (below) holds every new leaf beside its old one instead.
        update_norm = norm(apply(grads, state.opt_state, state.params)[2])
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
        params, opt_state = jax.lax.cond(
            finite,
            lambda grads, opt_state, params: apply(grads, opt_state, params)[:2],
            lambda grads, opt_state, params: (params, opt_state),
            grads,
            state.opt_state,
            state.params,
        )
    else:
        params, opt_state, updates = apply(grads, state.opt_state, state.params)
        update_norm = norm(updates)
        # A finite loss can still give a non-finite update (an infinite learning rate, an overflow in the
        # optimizer), which would poison every later step: skip those too.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
        if skip_nonfinite:
            keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
            params = keep(params, state.params)
            opt_state = keep(opt_state, state.opt_state)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "param_norm": norm(params),
        "update_norm": update_norm,
        "nonfinite": (~finite).astype(jnp.int32),
    }
    return params, opt_state, metrics


class _Gradients:
    """The step's gradient sums over its microbatches, and the loss of its first microbatch (Sophia-H).

    Args: see `make_train_step`.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        join: Callable[[Any, Any], Any] | None,
        accumulation: int,
        microbatch_sharding: Any,
        invariant: CanonicalSlices | None = None,
    ) -> None:
        self.loss_fn = loss_fn
        self.join = join
        self.accumulation = accumulation
        self.microbatch_sharding = microbatch_sharding
        self.grad_fn = jax.value_and_grad(self.loss, has_aux=True)
        if invariant is not None:  # gradients of the weights' shards, each slice's added in a fixed order
            self.grad_fn = sliced_value_and_grad(self.loss, invariant)

    def loss(self, params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any = None) -> Any:
        """``(loss sum in float32, (stats, per-example stats, what the model reported))`` of ``batch``.

        The reports leave the gradient's trace as its auxiliary output; without a collector there are none.
        """
        model = params if self.join is None else self.join(frozen, params)
        (loss_sum, stats), reports = capture_reports(self.loss_fn)(model, batch, key)
        stats = dict(stats)
        examples = {name: stats.pop(name) for name in EXAMPLE_STATS if name in stats}
        return loss_sum.astype(jnp.float32), (stats, examples, reports)

    def _placed(self, microbatch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        if self.microbatch_sharding is None:
            return microbatch
        return jax.lax.with_sharding_constraint(microbatch, self.microbatch_sharding)

    def first_microbatch_loss(
        self, batch: dict[str, jax.Array], key: jax.Array, frozen: Any
    ) -> Callable[[Any], jax.Array]:
        """``params -> token-mean loss`` of the step's first microbatch."""
        first = batch
        if self.accumulation > 1:
            first = self._placed(
                jax.tree_util.tree_map(lambda x: x[0], split_microbatches(batch, self.accumulation))
            )

        def mean_loss(params: Any) -> jax.Array:
            loss_sum, (stats, _, _) = self.loss(params, first, key, frozen)
            return loss_sum / jnp.maximum(stats["num_tokens"].astype(jnp.float32), 1.0)

        return mean_loss

    def sums(
        self, params: Any, batch: dict[str, jax.Array], key: jax.Array, frozen: Any
    ) -> tuple[Any, jax.Array, Any, dict[str, jax.Array]]:
        """``(gradient sums, loss sum, stat sums, per-example stats)`` over the batch's microbatches, in order;
        the per-example stats in the batch's row order. What the model reported, combined over the
        microbatches, goes to the watched step's collector (`_collecting`; nowhere without one)."""
        if self.accumulation == 1:
            (loss_sum, (stats, examples, reports)), grads = self.grad_fn(params, batch, key, frozen)
            reports.emit()
            return grads, loss_sum, stats, examples
        micro = split_microbatches(batch, self.accumulation)
        keys = jax.random.split(key, self.accumulation)
        first = jax.tree_util.tree_map(lambda x: x[0], micro)
        (_, (stats_shape, _, _)), _ = jax.eval_shape(self.grad_fn, params, first, keys[0], frozen)
        zero_grads = jax.tree_util.tree_map(jnp.zeros_like, params)
        zero_stats = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, jnp.float32), stats_shape)

        def body(carry: Any, inputs: Any) -> tuple[Any, Any]:
            grads, loss_sum, stats = carry
            microbatch, micro_key = inputs
            (mb_loss, (mb_stats, mb_examples, mb_reports)), mb_grads = self.grad_fn(
                params, self._placed(microbatch), micro_key, frozen
            )
            grads = jax.tree_util.tree_map(jnp.add, grads, mb_grads)
            stats = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), stats, mb_stats)
            return (grads, loss_sum + mb_loss, stats), (mb_examples, mb_reports)

        (grads, loss_sum, stats), (examples, reports) = jax.lax.scan(
            body, (zero_grads, jnp.zeros((), jnp.float32), zero_stats), (micro, keys)
        )
        # Microbatch m holds rows m, m + M, m + 2M, ... (`split_microbatches`): row j of microbatch m is row
        # j * M + m of the batch.
        examples = {name: jnp.swapaxes(value, 0, 1).reshape(-1) for name, value in examples.items()}
        reports.combined().emit()
        return grads, loss_sum, stats, examples


def schedule_count(opt_state: Any, *, default: jax.Array) -> jax.Array:
    """The update count at which the optimizer's learning-rate schedule is read next (the count of its
    ``optax.scale_by_learning_rate`` state), or ``default`` when its learning rate is a constant."""
    is_schedule = lambda node: isinstance(node, optax.ScaleByScheduleState)
    counts = [
        node.count for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_schedule) if is_schedule(node)
    ]
    return counts[0] if counts else default


def _float32_if_floating(value: jax.Array) -> jax.Array:
    # Norms of bfloat16 parameters are bfloat16: a logged figure should not round to 3 digits.
    return value.astype(jnp.float32) if jnp.issubdtype(value.dtype, jnp.floating) else value
