"""`BlockSeq`: the unrolled twin of `Stacked` (a Python loop over separate layer modules).

`Stacked.unrolled()` turns a stack into one; `Stacked.from_layers(seq.layers(), seq.Layers, seq.remat)` turns
one back (this module sits below stacked.py and does not import it).

Useful to compare against `Stacked`, for layers that differ slightly, and where unrolling is faster
to run (small N) at the price of compiling each layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from halyard.named.axis import Axis
from halyard.named.nn.layer_stack import (
    LayerStack,
    M,
    PerLayerInputs,
    add_layers_axis,
    block_factory,
    check_layers_axis,
    layer_keys,
    match_carry,
)
from halyard.named.nn.remat import check_remat, checkpoint_layer
from halyard.named.reporting import capture_reports


class BlockSeq(LayerStack[M]):
    """N layers kept as a tuple of modules and applied one after the other.

    Attributes:
        blocks: the layers.
        Layers: the layer axis (static); its size is the number of blocks.
        remat: per-layer rematerialisation (``"nested"`` acts as ``"full"`` here) (static).
    """

    blocks: tuple[M, ...]
    Layers: Axis = eqx.field(static=True)
    remat: str = eqx.field(static=True, default="none")

    def __check_init__(self) -> None:
        check_layers_axis(self.Layers)
        check_remat(self.remat)
        if len(self.blocks) != self.Layers.size:
            raise ValueError(f"BlockSeq has {len(self.blocks)} blocks but Layers is {self.Layers!r}")

    @classmethod
    def init(
        cls, Layers: Axis, Block: Any, *args: Any, key: jax.Array, remat: str = "none", **kwargs: Any
    ) -> BlockSeq[Any]:
        """Initialise each layer with its own key; the same key gives `Stacked.init`'s parameters.

        Arguments and errors as in `Stacked.init`.
        """
        check_layers_axis(Layers)
        check_remat(remat)
        make = block_factory(Block)
        keys = jax.random.split(key, Layers.size)
        return cls(tuple(make(*args, key=keys[i], **kwargs) for i in range(Layers.size)), Layers, remat)

    @property
    def num_layers(self) -> int:
        return self.Layers.size

    def layer(self, index: int) -> M:
        return self.blocks[index]

    def layers(self) -> list[M]:
        return list(self.blocks)

    def with_layers(self, layers: Sequence[M]) -> BlockSeq[M]:
        return BlockSeq(tuple(layers), self.Layers, self.remat)

    def fold(
        self,
        x: Any,
        *args: Any,
        key: jax.Array | None = None,
        kinds: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Apply every layer in turn; see `Stacked.fold` (same arguments, same per-layer keys and kinds)."""
        carry, _ = self._run(x, args, kwargs, key, kinds, with_outputs=False)
        return carry

    def scan(
        self,
        x: Any,
        *args: Any,
        key: jax.Array | None = None,
        kinds: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """Layers return ``(x, y)``; returns ``(x, ys)`` with ys stacked along ``Layers``; see `Stacked.scan`."""
        return self._run(x, args, kwargs, key, kinds, with_outputs=True)

    def _run(
        self,
        x: Any,
        args: tuple,
        kwargs: dict,
        key: jax.Array | None,
        kinds: Sequence[Any] | None,
        with_outputs: bool,
    ) -> tuple[Any, Any]:
        keys = layer_keys(key, self.Layers.size)
        if kinds is not None and len(kinds) != self.Layers.size:
            raise ValueError(f"BlockSeq: {len(kinds)} kinds were given for {self.Layers.size} layers")

        inputs = PerLayerInputs(args, kwargs, self.Layers, "BlockSeq")

        def step(
            params: Any, static: Any, carry: Any, layer_key: Any, slices: list[Any], kind: Any
        ) -> tuple[Any, Any]:
            layer = eqx.combine(params, static)
            layer_args, layer_kwargs = inputs.rebuild(slices)
            if layer_key is not None:
                layer_kwargs = {**layer_kwargs, "key": layer_key}
            if kinds is not None:
                layer_kwargs = {**layer_kwargs, "kind": kind}
            result, reports = capture_reports(layer)(carry, *layer_args, **layer_kwargs)
            new_carry, output = result if with_outputs else (result, None)
            return match_carry(new_carry, carry, "BlockSeq"), (output, reports)

        outputs, reports = [], []
        for i, layer in enumerate(self.blocks):
            params, static = eqx.partition(layer, eqx.is_array)
            # The static half holds no arrays, so it is closed over rather than traced.
            kind = None if kinds is None else kinds[i]
            run_layer = checkpoint_layer(
                lambda p, c, k, s, static=static, kind=kind: step(p, static, c, k, s, kind), self.remat
            )
            x, (output, layer_reports) = run_layer(
                params, x, None if keys is None else keys[i], [a[i] for a in inputs.sliced]
            )
            outputs.append(output)
            reports.append(layer_reports)
        # What the layers reported, stacked per layer like a scan's outputs (see halyard.named.reporting).
        jax.tree.map(lambda *values: jax.numpy.stack(values), *reports).per_layer().emit()
        if not with_outputs:
            return x, None
        stacked_outputs = jax.tree.map(lambda *ys: jax.numpy.stack(ys), *outputs)
        return x, add_layers_axis(stacked_outputs, self.Layers)
