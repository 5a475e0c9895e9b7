"""Rematerialisation (gradient checkpointing) policies for a stack of layers, chosen by name.

- ``"none"``: keep every activation for the backward pass (fastest, most memory).
- ``"full"``: keep only each layer's input; recompute the layer in the backward pass.
- ``"save_dots"``: keep the results of matmuls without batch dimensions (the projections), recompute
  the cheap elementwise work and the attention scores (``dots_with_no_batch_dims_saveable``). An
  attention kernel's own residuals (values named `KERNEL_RESIDUALS`: the splash kernel's output and
  log-sum-exp) are kept too, so the backward pass does not run the kernel's forward again.
- ``"nested"``: group the L layers into about sqrt(L) blocks of about sqrt(L) layers; keep only block
  inputs, and recompute a block layer by layer (memory ~ 2 sqrt(L) layer inputs). In an unrolled
  `BlockSeq` this is the same as ``"full"``.
- ``"save_attention"``: keep only the attention kernel's inputs and output (the values a layer names
  `ATTENTION_SAVED_NAMES` with ``checkpoint_name``: rotated queries, keys, values, the attended output,
  and the kernel's residuals);
  recompute the projections' neighbours, norms and the MLP. A fraction of ``"save_dots"``'s memory
  (with grouped-query attention and a 4x MLP about a fifth), and the quadratic attention is not redone
  outside its kernel's own backward. In a block that names nothing it is ``"full"``.
- ``"offload"``: like ``"save_dots"``, but the saved matmul results live in pinned host memory
  (``offload_dot_with_no_batch_dims("device", "pinned_host")``). Used when the device exposes a
  ``pinned_host`` memory (GPU, TPU, and the CPU backend of recent JAX, where host and device memory
  are the same RAM so nothing is saved but the program is the same); on a backend without one it
  falls back to ``"save_dots"``: identical values, activations stay in device memory.

An int8 projection (`halyard.named.nn.int8_dot`) is a ``dot_general`` with an int32 result followed by its
rescaling: ``"save_dots"`` and ``"offload"`` keep its rescaled output (named `INT8_PROJECTION`, in the
compute dtype) instead of the int32 sums, which would take twice the bytes of a bfloat16 projection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

RematPolicy = Literal["none", "full", "save_dots", "nested", "offload", "save_attention"]
REMAT_POLICIES: tuple[str, ...] = ("none", "full", "save_dots", "nested", "offload", "save_attention")
KERNEL_RESIDUALS = "attention_kernel_residuals"
"""The ``checkpoint_name`` of an attention kernel's forward residuals (the splash kernel's output and
log-sum-exp, named inside its ``custom_vjp`` forward): kept by ``"save_dots"`` and ``"save_attention"``, so
the backward pass reads them instead of running the kernel's forward a second time."""
ATTENTION_SAVED_NAMES: tuple[str, ...] = (
    "attention_query",
    "attention_key",
    "attention_value",
    "attention_output",
    KERNEL_RESIDUALS,
)
"""The ``checkpoint_name`` names ``"save_attention"`` keeps (set by the attention layer and its kernel)."""
INT8_PROJECTION = "int8_projection"
"""The ``checkpoint_name`` of an int8 projection's rescaled output: what ``"save_dots"`` keeps of it."""


def check_remat(remat: str) -> str:
    """``remat`` when it is one of `REMAT_POLICIES`; ValueError listing them otherwise."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"Unknown remat policy {remat!r}; choose one of {list(REMAT_POLICIES)}")
    return remat


def offload_supported(device: jax.Device | None = None) -> bool:
    """Whether ``device`` (default: the first device) has a ``pinned_host`` memory to offload into."""
    device = device or jax.devices()[0]
    try:
        kinds = {memory.kind for memory in device.addressable_memories()}
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return "pinned_host" in kinds


def effective_remat(remat: str, device: jax.Device | None = None) -> str:
    """The policy that actually runs: ``"offload"`` becomes ``"save_dots"`` without pinned host memory."""
    check_remat(remat)
    if remat == "offload" and not offload_supported(device):
        return "save_dots"
    return remat


def checkpoint_layer(
    fn: Callable[..., Any], remat: str, *, recomputed: tuple[str, ...] = ()
) -> Callable[..., Any]:
    """``fn`` (one layer step) wrapped in ``jax.checkpoint`` as ``remat`` asks.

    ``"nested"`` gives the per-layer part (full recomputation); the grouping into blocks is done by
    the caller. ``prevent_cse=False`` because the step runs inside ``scan``, which already keeps XLA
    from merging the recomputation with the forward pass.

    Args:
        fn: the layer step.
        remat: one of `REMAT_POLICIES`.
        recomputed: ``checkpoint_name`` names of values recomputed in the backward pass even with
            ``"none"`` (the other policies keep only matmul results, or nothing).
    """
    remat = effective_remat(remat)
    if remat == "none" and recomputed:
        policy = jax.checkpoint_policies.save_anything_except_these_names(*recomputed)
        return jax.checkpoint(fn, policy=policy, prevent_cse=False)
    if remat == "none":
        return fn
    if remat in ("full", "nested"):
        return jax.checkpoint(fn, prevent_cse=False)
    if remat == "save_dots":
        policy = _projections(
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            jax.checkpoint_policies.save_only_these_names(INT8_PROJECTION, KERNEL_RESIDUALS),
        )
        return jax.checkpoint(fn, policy=policy, prevent_cse=False)
    if remat == "save_attention":
        kept = [name for name in ATTENTION_SAVED_NAMES if name not in recomputed]
        policy = jax.checkpoint_policies.save_only_these_names(*kept)
        return jax.checkpoint(fn, policy=policy, prevent_cse=False)
    policy = _projections(
        jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
        jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=(),
            names_which_can_be_offloaded=(INT8_PROJECTION,),
            offload_src="device",
            offload_dst="pinned_host",
        ),
    )
    return jax.checkpoint(fn, policy=policy, prevent_cse=False)


def _projections(float_dots: Callable[..., Any], int8_outputs: Callable[..., Any]) -> Callable[..., Any]:
    """A policy that decides floating-point matmuls by ``float_dots`` and everything else (an int8 dot's
    int32 sums, its named output) by ``int8_outputs``."""

    def policy(prim: Any, *args: Any, **params: Any) -> Any:
        result = params.get("preferred_element_type")
        if prim is jax.lax.dot_general_p and not (result is not None and jnp.issubdtype(result, jnp.integer)):
            return float_dots(prim, *args, **params)
        return int8_outputs(prim, *args, **params)

    return policy


def nested_block_size(num_layers: int) -> int:
    """Layers per block for ``"nested"``: the divisor of ``num_layers`` closest to its square root."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be at least 1, got {num_layers}")
    root = num_layers**0.5
    divisors = [d for d in range(1, num_layers + 1) if num_layers % d == 0]
    return min(divisors, key=lambda d: (abs(d - root), d))
