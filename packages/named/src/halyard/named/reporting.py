"""Values reported from inside compiled code (``jit``, ``scan``, remat, ``shard_map``), carried out as outputs.

Model code reports what it sees, wherever it runs::

    report("attention/logit_max", jnp.max(logits), reduce="max")

and the caller that wants those values collects them around the function it traces::

    loss, reports = collect_reports(loss_fn)(params, batch)      # inside the jitted step
    reports.finished()                                   # {"attention/logit_max/layers": [L], ...}

`report` does nothing unless a `collect_reports` is active while the code is traced: a program traced without a
collector is the same program as before, so nothing costs anything when nobody collects. A traced value
cannot leave the transformation it was computed in as a Python side effect (it would be a leaked tracer),
so every transformation between `collect_reports` and `report` carries the values out as outputs of its own:
`capture_reports` opens a frame inside the transformed function and returns the frame's values (a `Reports`, a
pytree) next to the function's result; outside, `Reports.emit` hands them to the enclosing frame.

- A layer stack (`halyard.named.nn.Stacked`, `BlockSeq`) does this for each layer, remat included: a value
  reported inside a layer comes out stacked per layer (``Reports.per_layer``), and its final name ends in
  ``/layers`` (an array ``[layers, ...]``).
- A loop over pieces of one batch (microbatches) returns each iteration's `Reports` as scan outputs and
  `Reports.combined` reduces them over the iterations.
- Under ``shard_map``, `Reports.across` reduces over the mapped mesh axes inside the mapped function, so the
  values leave it replicated (``out_specs=PartitionSpec()``).

A `report` reaching a frame from inside a transformation that does not carry reports out (a ``jax.vmap``,
a ``jax.grad`` without ``has_aux``, an inner ``jax.jit``, a ``custom_vjp`` rule) raises `ReportingError` naming the value, instead of failing
later with a leaked tracer.

Each value names how pieces of it combine (``reduce``): ``mean``, ``sum``, ``max``, ``min`` or ``rms``
(the root mean square: pieces keep their mean square, the root is taken once at the end). Pieces are
weighted equally, which is exact for the equal microbatches and device shards of a step.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp

REDUCTIONS = ("mean", "sum", "max", "min", "rms")
"""How pieces of a reported value combine (over microbatches, devices, or repeated reports in one frame)."""

LAYERS_SUFFIX = "/layers"
"""Appended to the final name of a value reported inside a layer stack (an array ``[layers, ...]``)."""


class ReportingError(ValueError):
    """A value was reported where it cannot be carried out, or with an unknown reduction or clashing shapes."""


@dataclass(frozen=True)
class _Kind:
    """What is static about a reported value: its name, how pieces combine, whether it is stacked per layer."""

    name: str
    reduce: str
    per_layer: bool = False


@dataclass
class _Frame:
    """The values reported in one traced function (one trace), in report order."""

    trace: Any
    values: dict[str, list[tuple[_Kind, jax.Array]]] = field(default_factory=dict)

    def add(self, kind: _Kind, value: jax.Array) -> None:
        if jax.extend.core.get_opaque_trace_state() != self.trace:
            raise ReportingError(
                f"report({kind.name!r}) ran inside a JAX transformation that does not carry reported values "
                "out (a vmap, a grad without has_aux, an inner jit, a custom_vjp rule): run that function "
                "through halyard.named.capture_reports inside the transformation and call .emit() on what it "
                "returns outside it"
            )
        self.values.setdefault(kind.name, []).append((kind, value))

    def reports(self) -> Reports:
        kinds, values = [], []
        for name, entries in self.values.items():
            kind = entries[0][0]
            shapes = {value.shape for _, value in entries}
            if any(other != kind for other, _ in entries) or len(shapes) > 1:
                raise ReportingError(
                    f"{name!r} was reported {len(entries)} times in one function with different reductions, "
                    f"layer stacking or shapes {sorted(shapes)}: report it once, or under distinct names"
                )
            stacked = jnp.stack([value for _, value in entries]) if len(entries) > 1 else entries[0][1]
            kinds.append(kind)
            values.append(_combine_axis(kind.reduce, stacked) if len(entries) > 1 else stacked)
        return Reports(tuple(kinds), tuple(values))


class _Frames(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Frame] = []


_FRAMES = _Frames()


def collecting_reports() -> bool:
    """Whether a value reported here is collected: model code skips a costly statistic when it is not."""
    return bool(_FRAMES.stack)


def report(name: str, value: Any, *, reduce: str = "mean") -> None:
    """Report ``value`` under ``name`` to the enclosing `collect_reports` (nothing happens without one).

    Args:
        name: the metric's name, ``/`` separating groups (``attention/logit_max``).
        value: a number or an array (float32 is kept; its gradient is stopped); an array ``[n]`` is logged as
            ``name/0`` ... ``name/n-1``.
        reduce: how pieces combine: ``mean``, ``sum``, ``max``, ``min`` or ``rms`` (see the module docstring).

    Raises:
        ReportingError: an unknown ``reduce``, or a call inside a transformation that does not carry values out.
    """
    if not _FRAMES.stack:
        return
    _check_reduce(reduce, name)
    prepared = jax.lax.stop_gradient(jnp.asarray(value, jnp.float32))
    if reduce == "rms":  # pieces keep the mean square; `Reports.finished` takes the root once
        prepared = jnp.square(prepared)
    _FRAMES.stack[-1].add(_Kind(name, reduce), prepared)


@jax.tree_util.register_pytree_node_class
class Reports:
    """Reported values on their way out of a traced function: a pytree whose leaves are the values and whose
    static part is their names and reductions, so it passes through ``scan``, remat and ``shard_map`` outputs.

    Values are held prepared (an ``rms`` value as its mean square) until `finished`.
    """

    def __init__(self, kinds: tuple[_Kind, ...] = (), values: tuple[jax.Array, ...] = ()) -> None:
        self.kinds = kinds
        self.values = values

    def tree_flatten(self) -> tuple[tuple[jax.Array, ...], tuple[_Kind, ...]]:
        return self.values, self.kinds

    @classmethod
    def tree_unflatten(cls, kinds: tuple[_Kind, ...], values: Sequence[jax.Array]) -> Reports:
        return cls(kinds, tuple(values))

    def __len__(self) -> int:
        return len(self.kinds)

    def __repr__(self) -> str:
        return f"Reports({', '.join(kind.name for kind in self.kinds)})"

    @property
    def names(self) -> list[str]:
        """The reported names, in report order."""
        return [kind.name for kind in self.kinds]

    def _map(self, fn: Callable[[_Kind, jax.Array], jax.Array], per_layer: bool | None = None) -> Reports:
        kinds = self.kinds
        if per_layer is not None:
            kinds = tuple(_Kind(kind.name, kind.reduce, per_layer) for kind in kinds)
        return Reports(kinds, tuple(fn(kind, value) for kind, value in zip(self.kinds, self.values)))

    def combined(self) -> Reports:
        """Every value ``[pieces, ...]`` reduced over its leading axis by its reduction (the iterations of a
        loop over microbatches, whose `Reports` came out of the loop stacked)."""
        return self._map(lambda kind, value: _combine_axis(kind.reduce, value))

    def per_layer(self) -> Reports:
        """The leading axis of every value is the layer index (what a layer stack's loop stacked).

        Raises:
            ReportingError: a value already stacked per layer (a layer stack inside a layer).
        """
        nested = [kind.name for kind in self.kinds if kind.per_layer]
        if nested:
            raise ReportingError(f"{nested} were reported inside a layer stack inside a layer stack")
        return self._map(lambda kind, value: value, per_layer=True)

    def across(self, axis_names: str | Sequence[str]) -> Reports:
        """Inside ``shard_map``: every value reduced over the devices of ``axis_names`` (the same on each)."""
        axes = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if not axes:
            return self
        return self._map(lambda kind, value: _combine_devices(kind.reduce, value, axes))

    def emit(self) -> None:
        """Report these values, as they are, to the enclosing frame (nothing happens without one).

        Raises:
            ReportingError: called inside a transformation that does not carry values out.
        """
        if not _FRAMES.stack:
            return
        frame = _FRAMES.stack[-1]
        for kind, value in zip(self.kinds, self.values):
            frame.add(kind, value)

    def finished(self) -> dict[str, jax.Array]:
        """The final values by name; a value stacked per layer is named ``<name>/layers`` (``[layers, ...]``)."""
        return {
            kind.name + (LAYERS_SUFFIX if kind.per_layer else ""): jnp.sqrt(value)
            if kind.reduce == "rms"
            else value
            for kind, value in zip(self.kinds, self.values)
        }


@contextlib.contextmanager
def _frame() -> Iterator[_Frame]:
    frame = _Frame(jax.extend.core.get_opaque_trace_state())
    _FRAMES.stack.append(frame)
    try:
        yield frame
    finally:
        _FRAMES.stack.pop()


def capture_reports(fn: Callable[..., Any]) -> Callable[..., tuple[Any, Reports]]:
    """``fn`` returning ``(result, Reports)``: the values reported while it runs, for carrying out of a
    transformation (call it inside the transformed function; `Reports.emit` the result outside).

    Without an active collector ``fn`` runs as it is and the `Reports` is empty (no extra outputs).
    """

    @functools.wraps(fn)
    def captured(*args: Any, **kwargs: Any) -> tuple[Any, Reports]:
        if not _FRAMES.stack:
            return fn(*args, **kwargs), Reports()
        with _frame() as frame:
            result = fn(*args, **kwargs)
        return result, frame.reports()

    return captured


def collect_reports(fn: Callable[..., Any]) -> Callable[..., tuple[Any, Reports]]:
    """``fn`` returning ``(result, Reports)`` with every value reported while it runs (also when no other
    collector is active): where a step starts listening. ``Reports.finished()`` gives the values."""

    @functools.wraps(fn)
    def collected(*args: Any, **kwargs: Any) -> tuple[Any, Reports]:
        with _frame() as frame:
            result = fn(*args, **kwargs)
        return result, frame.reports()

    return collected


def _check_reduce(reduce: str, name: str) -> None:
    if reduce not in REDUCTIONS:
        raise ReportingError(f"report({name!r}, reduce={reduce!r}): use one of {', '.join(REDUCTIONS)}")


def _combine_axis(reduce: str, value: jax.Array) -> jax.Array:
    if reduce == "sum":
        return jnp.sum(value, axis=0)
    if reduce == "max":
        return jnp.max(value, axis=0)
    if reduce == "min":
        return jnp.min(value, axis=0)
    return jnp.mean(value, axis=0)  # mean, and rms's mean squares


def _combine_devices(reduce: str, value: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    if reduce in ("mean", "rms"):
        return jax.lax.pmean(value, axes)
    return {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}[reduce](value, axes)
