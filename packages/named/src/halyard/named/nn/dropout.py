"""`Dropout`: zero a random fraction of activations during training."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named import random
from halyard.named.axis import AxisSelector, axis_name
from halyard.named.broadcast import broadcast_to
from halyard.named.core import NamedArray


class Dropout(eqx.Module):
    """Keep each element with probability ``1 - rate`` and scale kept ones by ``1 / (1 - rate)``.

    Attributes:
        rate: probability of zeroing an element, in ``[0, 1)`` (static).
        broadcast_axes: axes along which one mask is shared (e.g. ``"pos"`` drops whole features
            for every position) (static).
        inference: when True the layer is the identity (static); can be overridden per call.
    """

    rate: float = eqx.field(static=True)
    broadcast_axes: tuple[str, ...] = eqx.field(static=True, default=())
    inference: bool = eqx.field(static=True, default=False)

    def __init__(self, rate: float, broadcast_axes: Sequence[AxisSelector] = (), inference: bool = False):
        """Args as the attributes; raises ValueError when ``rate`` is outside ``[0, 1)``."""
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"Dropout rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.broadcast_axes = tuple(axis_name(a) for a in broadcast_axes)
        self.inference = inference

    def __call__(
        self, x: NamedArray, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> NamedArray:
        """Apply dropout to ``x`` (axes and dtype kept).

        Args:
            x: the activations.
            key: PRNG key; required when the layer is active (training and ``rate > 0``).
            inference: overrides the layer's ``inference`` attribute for this call.

        Raises:
            ValueError: active without a key.
        """
        is_inference = self.inference if inference is None else inference
        if is_inference or self.rate == 0.0:
            return x
        if key is None:
            raise ValueError(
                "Dropout is active (inference=False, rate > 0) but no key was given: pass key=..., "
                "or inference=True for evaluation"
            )
        mask_axes = tuple(a for a in x.axes if a.name not in self.broadcast_axes)
        keep = random.bernoulli(key, mask_axes, 1.0 - self.rate)
        keep_everywhere = broadcast_to(keep, x.axes).array
        scaled = x.array * jnp.asarray(1.0 / (1.0 - self.rate), dtype=x.dtype)
        return NamedArray(jnp.where(keep_everywhere, scaled, jnp.zeros_like(scaled)), x.axes)
