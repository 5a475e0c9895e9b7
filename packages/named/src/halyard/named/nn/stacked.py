"""`Stacked`: N identical layers with stacked parameters, run with ``jax.lax.scan``.

Scanning compiles the layer once whatever N is, so compile time stays flat as models get deeper.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named.axis import Axis
from halyard.named.nn.block_seq import BlockSeq
from halyard.named.nn.layer_pattern import Run, repeating_runs
from halyard.named.nn.layer_stack import (
    LayerStack,
    M,
    PerLayerInputs,
    add_layers_axis,
    block_factory,
    check_layers_axis,
    index_layer,
    layer_keys,
    layer_view,
    match_carry,
    stack_layers,
)
from halyard.named.nn.remat import check_remat, checkpoint_layer, nested_block_size
from halyard.named.reporting import capture_reports


@eqx.filter_jit
def _init_layers(make: Callable[..., Any], args: tuple, kwargs: dict, keys: jax.Array) -> Any:
    """Every layer's parameters, stacked, from one compiled program.

    A ``lax.map`` over the keys rather than a ``vmap``: a batched random-number generator compiles
    about three times slower on CPU, and the results are the same (each layer depends only on its key).
    """
    statics: list[Any] = []

    def one_layer(key: jax.Array) -> Any:
        dynamic, static = eqx.partition(make(*args, key=key, **kwargs), eqx.is_array)
        statics.append(static)
        return dynamic

    stacked = jax.lax.map(one_layer, keys)
    return eqx.combine(stacked, statics[0])


class Stacked(LayerStack[M]):
    """N layers of one module type whose parameters carry a leading ``Layers`` axis.

    Attributes:
        stacked: one module instance whose NamedArrays have ``Layers`` as their first axis (plain
            arrays have a leading dimension of size N).
        Layers: the layer axis, e.g. ``Axis("layers", 12)`` (static).
        remat: the rematerialisation policy, see `halyard.named.nn.remat` (static).
    """

    stacked: M
    Layers: Axis = eqx.field(static=True)
    remat: str = eqx.field(static=True, default="none")

    recomputed_names: ClassVar[tuple[str, ...]] = ()
    """Names (``jax.ad_checkpoint.checkpoint_name``) of values the backward pass recomputes rather than keeps,
    whatever ``remat`` says: what a subclass's `layer_parameters` fetches and names."""

    def __check_init__(self) -> None:
        check_layers_axis(self.Layers)
        check_remat(self.remat)

    @classmethod
    def init(
        cls, Layers: Axis, Block: Any, *args: Any, key: jax.Array, remat: str = "none", **kwargs: Any
    ) -> Stacked[Any]:
        """Initialise ``Layers.size`` layers at once (one compiled loop over per-layer keys).

        Args:
            Layers: the layer axis.
            Block: a module class with ``init(*args, key=..., **kwargs)``, or any factory with that signature.
            args, kwargs: passed to every layer's init.
            key: split into one key per layer (`BlockSeq.init` splits the same way, so both get equal
                parameters from the same key).
            remat: ``"none"``, ``"full"``, ``"save_dots"``, ``"nested"`` or ``"offload"``.

        Raises:
            TypeError: ``Layers`` is not an Axis, or ``Block`` has no ``init``.
            ValueError: unknown ``remat``; a layer already has an axis named like ``Layers``.
        """
        check_layers_axis(Layers)
        check_remat(remat)
        stacked = _init_layers(block_factory(Block), args, kwargs, jax.random.split(key, Layers.size))
        return cls(add_layers_axis(stacked, Layers), Layers, remat)

    @classmethod
    def from_layers(cls, layers: Sequence[M], Layers: Axis | None = None, remat: str = "none") -> Stacked[M]:
        """Stack existing layers (equal structure and shapes) along ``Layers`` (default ``Axis("layers", N)``)."""
        if not layers:
            raise ValueError("Stacked.from_layers needs at least one layer")
        Layers = Layers or Axis("layers", len(layers))
        return cls(stack_layers(layers, Layers), Layers, remat)

    # -- the LayerStack interface ------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.Layers.size

    def layer(self, index: int) -> M:
        """Layer ``index`` as a plain module (its NamedArrays without the ``Layers`` axis)."""
        return index_layer(self.stacked, self.Layers, index)

    def layers(self) -> list[M]:
        return [self.layer(i) for i in range(self.Layers.size)]

    def with_layers(self, layers: Sequence[M]) -> Stacked[M]:
        return Stacked.from_layers(layers, self.Layers, self.remat)

    def unrolled(self) -> BlockSeq[M]:
        """The same layers as a `BlockSeq` (a Python loop; same parameters, ``fold`` and ``scan``)."""
        return BlockSeq(tuple(self.layers()), self.Layers, self.remat)

    def layer_parameters(self, params: Any) -> Any:
        """The parameters one layer runs with, from its slice of the stacked ones: here the slice itself.

        Called once per layer inside the scan (and inside the layer's checkpoint), so a subclass can fetch a
        layer's weights here as FSDP does: the invariant train step (`halyard.train.invariant`) gathers each
        layer's shards whole, and a device then holds one layer's gathered weights at a time.

        Args:
            params: the layer's arrays (the stacked module's array leaves without their ``Layers`` dimension;
                ``None`` where the module holds no array).
        """
        return params

    # -- running -----------------------------------------------------------------------------
    def fold(
        self,
        x: Any,
        *args: Any,
        key: jax.Array | None = None,
        kinds: Sequence[Hashable] | None = None,
        unroll: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Apply every layer in turn: ``x = layer(x, *args, **kwargs)``; returns the final ``x``.

        Args:
            x: the carry (a NamedArray or a pytree of them); each layer must return the same axes
                (their order may change: it is restored).
            args, kwargs: passed to every layer: unchanged (masks, positions, ...), except NamedArrays
                with the ``Layers`` axis (e.g. a KV cache), which are sliced: layer ``i`` gets slice ``i``.
            key: when given, split into one key per layer and passed as ``key=`` (dropout).
            kinds: one hashable static value per layer, passed to layer ``i`` as ``kind=kinds[i]`` (an
                attention window, a rotary setting): layers repeating a pattern of kinds are still scanned,
                in groups of one period (`halyard.named.nn.layer_pattern.repeating_runs`).
            unroll: unroll the loop (the same program without a loop: longer compiles, sometimes faster).

        Raises:
            ValueError: a layer changes the carry's axis names or structure; a sliced argument's
                ``Layers`` axis has another size; ``kinds`` has another length than ``Layers``.
        """
        carry, _ = self._run(x, args, kwargs, key, kinds, unroll, with_outputs=False)
        return carry

    def scan(
        self,
        x: Any,
        *args: Any,
        key: jax.Array | None = None,
        kinds: Sequence[Hashable] | None = None,
        unroll: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """Like `fold` for layers returning ``(x, y)``; returns ``(x, ys)`` with the ``y`` stacked along
        ``Layers`` (NamedArrays get the ``Layers`` axis in front; plain arrays a leading dimension)."""
        return self._run(x, args, kwargs, key, kinds, unroll, with_outputs=True)

    def _run(
        self,
        x: Any,
        args: tuple,
        kwargs: dict,
        key: jax.Array | None,
        kinds: Sequence[Hashable] | None,
        unroll: bool,
        with_outputs: bool,
    ) -> tuple[Any, Any]:
        num_layers = self.Layers.size
        if kinds is not None and len(kinds) != num_layers:
            raise ValueError(f"Stacked: {len(kinds)} kinds were given for {num_layers} layers")
        dynamic, static = eqx.partition(layer_view(self.stacked, self.Layers), eqx.is_array)
        inputs = PerLayerInputs(args, kwargs, self.Layers, "Stacked")
        keys = layer_keys(key, num_layers)

        def step(carry: Any, per_layer: tuple[Any, Any, list[Any]], kind: Any = None) -> tuple[Any, Any]:
            params, layer_key, slices = per_layer
            layer = eqx.combine(self.layer_parameters(params), static)
            layer_args, layer_kwargs = inputs.rebuild(slices)
            if layer_key is not None:
                layer_kwargs = {**layer_kwargs, "key": layer_key}
            if kinds is not None:
                layer_kwargs = {**layer_kwargs, "kind": kind}
            # What the layer reports leaves the scan (and its remat) as one more output, stacked per layer.
            result, reports = capture_reports(layer)(carry, *layer_args, **layer_kwargs)
            new_carry, output = result if with_outputs else (result, None)
            return match_carry(new_carry, carry, "Stacked"), (output, reports)

        xs = (dynamic, keys, inputs.sliced)
        runs = repeating_runs(kinds) if kinds is not None else [Run(0, num_layers, 1)]
        if self.remat == "nested" and len(runs) == 1 and runs[0].period == 1:
            kind = None if kinds is None else kinds[0]
            carry, outputs = self._nested_scan(lambda c, p: step(c, p, kind), x, xs, unroll)
        else:
            carry, pieces = x, []
            for run in runs:
                carry, piece = self._run_pattern(step, carry, xs, run, kinds, unroll)
                pieces.append(piece)
            outputs = pieces[0] if len(pieces) == 1 else jax.tree.map(lambda *a: jnp.concatenate(a), *pieces)
        outputs, reports = outputs
        reports.per_layer().emit()
        return carry, add_layers_axis(outputs, self.Layers) if with_outputs else None

    def _run_pattern(
        self, step: Callable[..., Any], x: Any, xs: Any, run: Run, kinds: Any, unroll: bool
    ) -> tuple[Any, Any]:
        """Scan over the repeats of ``run``'s pattern; each scan step runs one period of layers."""
        whole = (run.start, run.stop) == (0, self.Layers.size)
        period, repeats = run.period, run.repeats
        grouped = jax.tree.map(
            lambda a: (a if whole else a[run.start : run.stop]).reshape(repeats, period, *a.shape[1:]), xs
        )
        kinds_of = [None] * period if kinds is None else list(kinds[run.start : run.start + period])
        layer_steps = [
            checkpoint_layer(
                lambda c, per_layer, kind=kind: step(c, per_layer, kind),
                self.remat,
                recomputed=self.recomputed_names,
            )
            for kind in kinds_of
        ]

        if period == 1:
            # Each layer's slice of ``xs`` as the scan hands it over: indexing a group of one would make
            # it a new value, which the backward pass then keeps a stacked copy of (a copy of every weight).
            ungrouped = jax.tree.map(lambda a: a[:, 0], grouped)
            return jax.lax.scan(layer_steps[0], x, ungrouped, unroll=unroll)

        def group_step(carry: Any, group: Any) -> tuple[Any, Any]:
            outputs = []
            for index, layer_step in enumerate(layer_steps):
                carry, output = layer_step(carry, jax.tree.map(lambda a, i=index: a[i], group))
                outputs.append(output)
            return carry, jax.tree.map(lambda *o: jnp.stack(o), *outputs)

        carry, outputs = jax.lax.scan(group_step, x, grouped, unroll=unroll)
        return carry, jax.tree.map(lambda a: a.reshape(repeats * period, *a.shape[2:]), outputs)

    def _nested_scan(self, step: Callable[..., Any], x: Any, xs: Any, unroll: bool) -> tuple[Any, Any]:
        """Scan of scans: sqrt(N) checkpointed blocks of checkpointed layers."""
        per_block = nested_block_size(self.Layers.size)
        num_blocks = self.Layers.size // per_block
        blocked = jax.tree.map(lambda a: a.reshape(num_blocks, per_block, *a.shape[1:]), xs)
        inner_step = checkpoint_layer(step, "full")

        def block_step(carry: Any, block_xs: Any) -> tuple[Any, Any]:
            return jax.lax.scan(inner_step, carry, block_xs, unroll=unroll)

        carry, outputs = jax.lax.scan(
            jax.checkpoint(block_step, prevent_cse=False), x, blocked, unroll=unroll
        )
        flat = jax.tree.map(lambda a: jnp.reshape(a, (self.Layers.size, *a.shape[2:])), outputs)
        return carry, flat
