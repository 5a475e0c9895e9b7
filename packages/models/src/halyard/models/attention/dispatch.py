"""`attention`: one entry point, several implementations behind the ``implementation`` switch.

The ``auto`` rule:

1. on an NVIDIA GPU, when cuDNN supports the inputs (bfloat16/float16, head_size <= 128 and a multiple
   of 8): ``cudnn``;
2. on CPU: ``blocked``: faster than ``xla`` for training-length sequences (it skips masked blocks and
   stays in cache; figures in benchmarks/README.md), as fast for one-token decoding, with memory linear
   in length;
3. on a TPU, when the splash kernel takes the inputs (self-attention with default positions and no
   ``key_valid``: training and prefill; `halyard.models.attention.splash`): ``splash``, with or without a
   ``logit_softcap``;
4. on other accelerators (GPU without cuDNN support, TPU), when ``num_queries * num_keys <=
   AUTO_XLA_MAX_SCORES`` (``2048 * 2048``): ``xla``, whose fused quadratic path is fast there at that size;
5. otherwise: ``blocked``, whose memory is linear in sequence length.

Off TPU, with a ``logit_softcap`` (Gemma 2), ``auto`` is ``blocked``: ``xla`` and ``cudnn`` (both
``jax.nn.dot_product_attention``) cannot cap the logits, so only `SOFTCAP_IMPLEMENTATIONS` accept one.
``splash`` runs anywhere (off TPU in Pallas's interpret mode: exact, slow; for tests).

When the active layout splits ``pos`` over several devices (``trainer.mesh.sequence``), attention runs
context-parallel (`halyard.models.attention.context_parallel`: ``ring``, ``all_gather``, ``ulysses``) with
the blocked kernel on each device's share; ``context_parallel=None`` (a KV cache) or
``implementation="reference"`` never splits.

An inference engine's step attends over its page pool instead (`paged_kernel`: ``blocked``, the training
kernel's arithmetic page by page, on any backend; ``pallas``, JAX's ragged paged TPU kernel; ``auto``: ``pallas``
on a TPU, ``blocked`` elsewhere), behind the interface of
`halyard.models.attention.ragged_paged.RaggedPagedKernel`.

Switching implementation never changes parameters: every implementation computes the same function
(tested against ``reference`` in values and gradients).
"""

from __future__ import annotations

import math

from halyard.models.attention.blocked import blocked_attention
from halyard.models.attention.context_parallel import (
    CONTEXT_PARALLEL,
    context_parallel_attention,
    context_split,
    layout_split,
)
from halyard.models.attention.cudnn import cudnn_attention, cudnn_unsupported_reason
from halyard.models.attention.layout import FlatAttention, flatten_inputs, unflatten_output
from halyard.models.attention.mask import AttentionMask
from halyard.models.attention.paged import BlockedPagedKernel
from halyard.models.attention.ragged_paged import RaggedPagedKernel
from halyard.models.attention.reference import reference_attention
from halyard.models.attention.softcap import checked_softcap
from halyard.models.attention.splash import (
    SplashBlockSizes,
    sharded_splash_attention,
    splash_unsupported_reason,
)
from halyard.models.attention.xla import xla_attention
from halyard.named import NamedArray
from halyard.named.nn import target_backend
from halyard.named.nn.target_backend import traced_elsewhere

IMPLEMENTATIONS = ("reference", "xla", "blocked", "cudnn", "splash", "auto")
PAGED_IMPLEMENTATIONS = ("blocked", "pallas", "auto")
"""The kernels `paged_kernel` offers an inference engine's step."""
SOFTCAP_IMPLEMENTATIONS = ("reference", "blocked", "splash", "auto")
"""The implementations that accept a ``logit_softcap``."""
CPU_BLOCK_SIZE = 64
"""The ``blocked`` kernel's block on CPU. Measured (fwd+bwd, causal, 8 heads of 64, one core): 0.85x the
time of 128-blocks at 256 tokens, 0.68x at 512, 0.89x at 1024, 1.05x at 2048."""
ACCELERATOR_BLOCK_SIZE = 128
AUTO_XLA_MAX_SCORES = 2048 * 2048
"""Above this many query-key pairs, ``auto`` on an accelerator without cuDNN switches from ``xla`` to ``blocked``."""


def attention(
    query: NamedArray,
    key: NamedArray,
    value: NamedArray,
    mask: AttentionMask,
    *,
    implementation: str = "auto",
    scale: float | None = None,
    block_size: int | None = None,
    logit_softcap: float | None = None,
    context_parallel: str | None = "auto",
    splash_block_sizes: SplashBlockSizes | None = None,
) -> NamedArray:
    """Scaled dot-product attention over named axes, with grouped-query support.

    Args:
        query: ``(batch..., "pos", "heads", "head_size")``.
        key: ``(batch..., "key_pos", "kv_heads", "head_size")``; ``heads`` must be a multiple of
            ``kv_heads``: query head ``h`` reads kv head ``h // (heads // kv_heads)`` (Hugging Face's
            convention; ``kv_heads=1`` is multi-query attention).
        value: ``(batch..., "key_pos", "kv_heads", "head_size")``.
        mask: an `AttentionMask` (causal, sliding window, segment ids, positions, key validity).
        implementation: ``reference`` | ``xla`` | ``blocked`` | ``cudnn`` | ``splash`` | ``auto`` (see
            the module docstring for the rule ``auto`` follows).
        scale: the logit multiplier; default ``1/sqrt(head_size)`` (muP passes ``1/head_size``).
        block_size: queries and keys per block for ``blocked``; ``None``: `default_block_size`.
        logit_softcap: ``cap``: the scaled logits become ``cap * tanh(logits / cap)`` before the mask
            and the softmax (Gemma 2's ``attn_logit_softcapping``); None: no capping.
        context_parallel: ``auto`` | ``ring`` | ``all_gather`` | ``ulysses``: how to attend when the active
            layout splits ``pos`` over several devices (see the module docstring); None: never split.
        splash_block_sizes: the ``splash`` kernel's tiles; None: `SplashBlockSizes`'s defaults.

    Returns:
        ``(batch..., "pos", "heads", "head_size")`` in the query's axis order and dtype. Rows whose
        every key is masked are zeros.

    Raises:
        ValueError: an unknown implementation, missing or mismatched axes, heads not a multiple of
            kv_heads, a mask array with the wrong axes, ``cudnn`` or ``splash`` where the kernel cannot
            run these inputs, a ``logit_softcap`` that is not a positive number, or one given to ``xla``
            or ``cudnn``.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention: unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS}"
        )
    if not isinstance(mask, AttentionMask):
        raise TypeError(f"attention: mask must be an AttentionMask, got {type(mask).__name__}")
    if context_parallel is not None and context_parallel not in CONTEXT_PARALLEL:
        raise ValueError(
            f"attention: unknown context_parallel {context_parallel!r}; choose one of {CONTEXT_PARALLEL} or None"
        )
    logit_softcap = checked_softcap(logit_softcap, "attention")
    if logit_softcap is not None and implementation not in SOFTCAP_IMPLEMENTATIONS:
        raise ValueError(
            f"attention: implementation={implementation!r} has no logit soft-capping; with logit_softcap "
            f"use one of {SOFTCAP_IMPLEMENTATIONS}"
        )
    flat = flatten_inputs(query, key, value, mask)
    if scale is None:
        scale = 1.0 / math.sqrt(query.axis_size("head_size"))
    if implementation == "auto":
        chosen = choose_implementation(flat, logit_softcap=logit_softcap)
    else:
        chosen = implementation
    split = context_split(query, key) if context_parallel is not None and chosen != "reference" else None
    if split is not None and context_parallel is not None:
        block_size = default_block_size() if block_size is None else block_size
        output = context_parallel_attention(
            flat,
            split,
            implementation=context_parallel,
            scale=scale,
            block_size=block_size,
            logit_softcap=logit_softcap,
        )
        return unflatten_output(flat, output)
    if chosen == "reference":
        return reference_attention(query, key, value, mask, scale=scale, logit_softcap=logit_softcap)
    if chosen == "xla":
        output = xla_attention(flat, scale=scale)
    elif chosen == "blocked":
        block_size = default_block_size() if block_size is None else block_size
        output = blocked_attention(flat, scale=scale, block_size=block_size, logit_softcap=logit_softcap)
    elif chosen == "splash":
        output = sharded_splash_attention(
            flat,
            layout_split(query, key),
            scale=scale,
            block_sizes=splash_block_sizes,
            logit_softcap=logit_softcap,
        )
    else:
        output = cudnn_attention(flat, scale=scale)
    return unflatten_output(flat, output)


def default_block_size(backend: str | None = None) -> int:
    """The ``blocked`` kernel's block when none is given: `CPU_BLOCK_SIZE` on CPU, else 128.

    Args:
        backend: JAX's platform name; default `target_backend` (JAX's, unless `compiling_for` says another).
    """
    backend = target_backend() if backend is None else backend
    return CPU_BLOCK_SIZE if backend == "cpu" else ACCELERATOR_BLOCK_SIZE


def choose_implementation(
    flat: FlatAttention, *, backend: str | None = None, logit_softcap: float | None = None
) -> str:
    """The implementation ``auto`` picks for these inputs (see the module docstring).

    Args:
        flat: the inputs, laid out by `halyard.models.attention.layout.flatten_inputs`.
        backend: JAX's platform name (``cpu``, ``gpu``, ``tpu``); default `target_backend` (JAX's, unless
            `compiling_for` says another).
        logit_softcap: the attention's logit cap, or None; a cap rules out ``xla`` and ``cudnn``.
    """
    # Planning a TPU's step elsewhere (`compiling_for`): `blocked` stands in for `splash`, with the same
    # residuals (queries, keys, values, output, log-sum-exp) and block-sized workspace; the splash kernel's
    # interpret mode would hold whole-array scratch that the TPU's kernel does not.
    planned_elsewhere = backend is None and traced_elsewhere()
    backend = target_backend() if backend is None else backend
    if backend == "tpu" and splash_unsupported_reason(flat) is None:
        return "blocked" if planned_elsewhere else "splash"
    if logit_softcap is not None:
        return "blocked"
    if backend == "gpu" and cudnn_unsupported_reason(flat) is None:
        return "cudnn"
    if backend == "cpu":
        return "blocked"
    num_queries, num_keys = flat.query.shape[1], flat.key.shape[1]
    return "xla" if num_queries * num_keys <= AUTO_XLA_MAX_SCORES else "blocked"


def paged_kernel(implementation: str = "auto", *, backend: str | None = None) -> RaggedPagedKernel:
    """The ragged paged attention kernel of an inference engine's step (see the module docstring).

    Args:
        implementation: ``blocked`` | ``pallas`` | ``auto``.
        backend: JAX's platform name; None: the backend the program is traced for (`target_backend`).

    Raises:
        ValueError: an unknown implementation, or ``pallas`` where its module is missing.
    """
    if implementation not in PAGED_IMPLEMENTATIONS:
        raise ValueError(
            f"paged_kernel: unknown implementation {implementation!r}; choose one of {PAGED_IMPLEMENTATIONS}"
        )
    if implementation == "auto":
        # Planned on a CPU for a TPU (`traced_elsewhere`): ``blocked``, as `_auto` does for splash; the
        # interpreted Pallas kernel would hold whole-array scratch that the chip's kernel does not.
        planned_elsewhere = backend is None and traced_elsewhere()
        backend = target_backend() if backend is None else backend
        implementation = "pallas" if backend == "tpu" and not planned_elsewhere else "blocked"
    if implementation == "blocked":
        return BlockedPagedKernel()
    try:
        from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel
    except ImportError as error:
        raise ValueError(
            f"paged_kernel: the pallas kernel is not available here ({error}); use 'blocked'"
        ) from error
    return PallasPagedKernel()
