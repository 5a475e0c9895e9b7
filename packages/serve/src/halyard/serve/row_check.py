"""Whether a program of fewer rows gives every row the same bits as the full-size program (deterministic mode).

XLA's CPU kernels pick their blocking and summation order from an operation's shape, so a row's numbers can
depend on how many rows share its program. Deterministic mode runs its decoding rows in programs of a fixed
size; a program of fewer rows is only used once it has been shown to compute its rows exactly as the
full-size one does: both run the same random probe (random tokens at random positions over random pages of
the pool, a mix of greedy, top-k, top-p and min-p rows), and every output of every probe row and every key
and value it would store must agree bit for bit. XLA fixes a kernel's summation order when it compiles,
by shape, not by value, and another order shows in the last bits of random rows, so one probe per shape
settles it; the answer is kept. The probe reads the pool's pages as they are (zeros in a fresh engine, the
keys of earlier requests later), and a size that disagrees for one page count is not tried for another.
On this project's CPUs, for the `llama` benchmark shape, 8 and 16 rows agree with 32 and 1, 2 and 4 do not
(a reduction over an array of fewer than about 4,096 elements runs in another order).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from halyard.serve.program import ProgramShape, StepInputs
from halyard.serve.sampler import RowSettings

PROBE_SEED = 20261205
"""The probe's fixed seed: every process of a multi-process engine builds the same probe."""


def probe_inputs(shape: ProgramShape, page_size: int, num_pages: int, vocab: int) -> StepInputs:
    """Random inputs of ``shape`` (see the module docstring); row 1 is padding, as a partly full program has.

    Args:
        shape: the full-size program's shape (a smaller program takes the first rows).
        page_size, num_pages: the pool's.
        vocab: the model's vocabulary size.
    """
    rng = np.random.default_rng(PROBE_SEED)
    rows, length = shape.rows, shape.tokens
    capacity = shape.seq_pages * page_size
    starts = rng.integers(0, capacity - length + 1, rows)
    positions = (starts[:, None] + np.arange(length)[None, :]).astype(np.int32)
    if rows > 1:
        positions[1] = -1
    cycle = np.arange(rows) % 4  # greedy; sampled; sampled with top-k and top-p; sampled with min-p
    settings = RowSettings(
        temperature=np.where(cycle == 0, 0.0, 0.9).astype(np.float32),
        top_k=np.where(cycle == 2, 20, 0).astype(np.int32),
        top_p=np.where(cycle == 2, 0.9, 1.0).astype(np.float32),
        min_p=np.where(cycle == 3, 0.05, 0.0).astype(np.float32),
        seed=rng.integers(0, 2**32, (rows, 2), dtype=np.uint32),
        sample=np.zeros(rows, np.int32),
        position=(starts + length).astype(np.int32),
    )
    return StepInputs(
        tokens=rng.integers(0, vocab, (rows, length), dtype=np.int32),
        positions=positions,
        page_table=rng.integers(0, num_pages, (rows, shape.seq_pages), dtype=np.int32),
        last=np.full(rows, length - 1, np.int32),
        settings=settings,
        next_tokens=rng.integers(0, vocab, (rows, length), dtype=np.int32) if shape.prompt_logprobs else None,
    )


def first_rows(inputs: StepInputs, rows: int) -> StepInputs:
    """The first ``rows`` rows of ``inputs``."""
    return StepInputs(
        tokens=inputs.tokens[:rows],
        positions=inputs.positions[:rows],
        page_table=inputs.page_table[:rows],
        last=inputs.last[:rows],
        settings=RowSettings(*(field[:rows] for field in inputs.settings)),
        next_tokens=None if inputs.next_tokens is None else inputs.next_tokens[:rows],
    )


def results_agree(small: tuple, full: tuple, rows: int) -> bool:
    """Whether a program's results for the first ``rows`` probe rows equal the full-size program's bit for bit.

    Args:
        small, full: each program's ``(written, outputs)``: the keys and values it would store (named arrays
            with a ``batch`` axis, perhaps sharded over several processes: compared on the devices) and its
            outputs (rows first, None where not computed; the same in every process).
        rows: the smaller program's rows.
    """
    (small_written, small_outputs), (full_written, full_outputs) = small, full
    for a, b in zip(small_written, full_written, strict=True):
        axis = a.axis_names.index("batch")
        if not bool(np.asarray(_same_bits(a.array, b.array, rows, axis))):
            return False
    for a, b in zip(small_outputs, full_outputs, strict=True):
        if a is None:
            continue
        here, there = np.asarray(a), np.ascontiguousarray(np.asarray(b)[:rows])
        if here.shape != there.shape or here.tobytes() != there.tobytes():
            return False
    return True


@functools.partial(jax.jit, static_argnums=(2, 3))
def _same_bits(small: jax.Array, full: jax.Array, rows: int, axis: int) -> jax.Array:
    """Whether ``small`` equals the first ``rows`` entries of ``full`` along ``axis``, bit for bit."""
    unsigned = jnp.dtype(f"uint{small.dtype.itemsize * 8}")
    head = jax.lax.slice_in_dim(full, 0, rows, axis=axis)
    return jnp.array_equal(
        jax.lax.bitcast_convert_type(small, unsigned), jax.lax.bitcast_convert_type(head, unsigned)
    )
