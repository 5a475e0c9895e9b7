"""Logit soft-capping, ``cap * tanh(logits / cap)`` (Gemma 2): smooth clipping of logits to ``(-cap, cap)``.

Shared by the attention kernels (on the scaled attention logits) and the next-token loss (on the output
logits). Callers apply it only when a cap is given, so the uncapped programs hold no extra operation.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp


def checked_softcap(logit_softcap: float | None, owner: str) -> float | None:
    """``logit_softcap`` as a float, or None; ``owner`` names the function in the error.

    Raises:
        ValueError: the cap is not a positive finite number.
    """
    if logit_softcap is None:
        return None
    if (
        isinstance(logit_softcap, bool)
        or not isinstance(logit_softcap, numbers.Real)
        or not math.isfinite(logit_softcap)
        or logit_softcap <= 0
    ):
        raise ValueError(
            f"{owner}: logit_softcap must be a positive finite number or None, got {logit_softcap!r}"
        )
    return float(logit_softcap)


def soft_cap(logits: jax.Array, cap: float) -> jax.Array:
    """``cap * tanh(logits / cap)``, elementwise."""
    return cap * jnp.tanh(logits / cap)


def soft_cap_derivative(capped: jax.Array, cap: float) -> jax.Array:
    """``d soft_cap / d logits`` from the capped values: ``1 - tanh**2 = 1 - (capped / cap)**2``."""
    return 1.0 - jnp.square(capped / cap)
