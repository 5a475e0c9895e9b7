"""Mixed precision: parameters kept in one dtype, the forward and backward computed in another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

_DTYPES = {
    "float32": jnp.float32,
    "f32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "f16": jnp.float16,
}


def resolve_dtype(name: str, *, key: str = "precision") -> Any:
    """``"bf16"`` -> ``jnp.bfloat16``; a ValueError naming ``key`` and the accepted names otherwise."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"{key}: unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


@dataclass(frozen=True)
class Precision:
    """A mixed-precision policy (``params=f32, compute=bf16, output=f32``).

    Args:
        params: dtype of the stored parameters and optimizer state.
        compute: dtype the model's floating-point parameters are cast to for forward and backward.
        output: dtype of the loss and metrics.
    """

    params: str = "float32"
    compute: str = "float32"
    output: str = "float32"

    def __post_init__(self) -> None:
        for field in ("params", "compute", "output"):
            resolve_dtype(getattr(self, field), key=f"precision.{field}")

    def cast_to_compute(self, tree: Any) -> Any:
        return _cast_floating(tree, resolve_dtype(self.compute))

    def cast_to_params(self, tree: Any) -> Any:
        return _cast_floating(tree, resolve_dtype(self.params))

    def cast_to_output(self, tree: Any) -> Any:
        return _cast_floating(tree, resolve_dtype(self.output))


def _cast_floating(tree: Any, dtype: Any) -> Any:
    def cast(x: Any) -> Any:
        if isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.floating):
            return (
                x.astype(dtype)
                if isinstance(x, jax.Array)
                else jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
            )
        return x

    return jax.tree_util.tree_map(cast, tree)
