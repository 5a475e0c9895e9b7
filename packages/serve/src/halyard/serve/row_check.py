"""Whether a program of fewer tokens gives every sequence the same bits as the full-size program
(deterministic mode).

XLA's CPU kernels pick their blocking and summation order from an operation's shape, so a token's numbers
can depend on how many tokens share its program. Deterministic mode runs its steps in programs of a fixed
size; a program of fewer tokens is only used once it has been shown to compute its sequences exactly as
the full-size one does: both run random probes (decoding tokens and prefill chunks of random sequences over
random pages of the pool, a mix of greedy, top-k, top-p and min-p sequences; the full program holds more
sequences after them, which store nothing), and every output of every probe sequence and every page it
stores must agree bit for bit. XLA fixes a kernel's summation order when it compiles, by shape, not by value.
In float32 another order shows in the last bits of nearly every random row; in bfloat16 the rounding of the
compute dtype hides it in most rows (a 1-token program of a bfloat16 Qwen2 differed from the full one in about
a quarter of random rows), so the probes go on until `PROBE_ROWS` sequences were compared. The answer is kept.
The probes read the pool's pages as they are (zeros in a fresh engine, the keys of earlier requests later),
and a size that disagrees for one page count is not tried for another.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models.attention.ragged_paged import PADDING_SLOT, ragged_batch
from halyard.named import NamedArray
from halyard.serve.program import ProgramShape, StepInputs
from halyard.serve.sampler import RowSettings

PROBE_SEED = 20261205
"""The first probe's fixed seed (the next ones count up from it): every process of a multi-process engine
builds the same probes."""
PROBE_ROWS = 32
"""Sequences a row check compares at least, over as many probes as that takes (a 1-token program: 32)."""


def probe_inputs(
    full: ProgramShape, small: ProgramShape, page_size: int, num_pages: int, vocab: int, probe: int = 0
) -> tuple[StepInputs, StepInputs, np.ndarray]:
    """Random inputs of ``small`` and of ``full`` (see the module docstring): ``small``'s sequences come
    first in ``full``'s, each sequence in ``small`` leaves at least one token and one slot of padding.
    ``probe`` numbers the probe (its seed is ``PROBE_SEED + probe``).

    Returns:
        ``(small's inputs, full's inputs, the pages small's sequences read and write)``.
    """
    rng = np.random.default_rng(PROBE_SEED + probe)
    capacity = full.seq_pages * page_size
    first = _lengths(rng, max(1, small.tokens - 1), max(1, small.seqs - 1), capacity)
    in_small = len(first)
    q_lens = first + _lengths(rng, full.tokens - sum(first), full.seqs - in_small, capacity)
    kv_lens = [int(rng.integers(q, capacity + 1)) for q in q_lens]
    tables = [rng.integers(0, num_pages, -(-kv // page_size)).tolist() for kv in kv_lens]
    tokens = [rng.integers(0, vocab, q).astype(np.int32) for q in q_lens]
    cycle = np.arange(len(q_lens)) % 4  # greedy; sampled; sampled with top-k and top-p; sampled with min-p
    settings = RowSettings(
        temperature=np.where(cycle == 0, 0.0, 0.9).astype(np.float32),
        top_k=np.where(cycle == 2, 20, 0).astype(np.int32),
        top_p=np.where(cycle == 2, 0.9, 1.0).astype(np.float32),
        min_p=np.where(cycle == 3, 0.05, 0.0).astype(np.float32),
        seed=rng.integers(0, 2**32, (len(q_lens), 2), dtype=np.uint32),
        sample=np.zeros(len(q_lens), np.int32),
        position=np.asarray(kv_lens, np.int32),
    )
    following = rng.integers(-1, vocab, full.tokens).astype(np.int32)

    def inputs(shape: ProgramShape, count: int) -> StepInputs:
        batch = ragged_batch(
            q_lens[:count], kv_lens[:count], tables[:count],
            page_size=page_size, tokens=shape.tokens, seqs=shape.seqs, pages=shape.seq_pages,
        )  # fmt: skip
        slots = batch.slots.copy()
        slots[batch.cu_q_lens[in_small] :] = PADDING_SLOT  # only small's sequences store
        flat = np.zeros((shape.tokens,), np.int32)
        flat[: batch.cu_q_lens[count]] = np.concatenate(tokens[:count])
        padded = []
        for field, fill in zip(settings, (0, 0, 1, 0, 0, 0, 0)):
            column = np.full((shape.seqs, *field.shape[1:]), fill, field.dtype)
            column[:count] = field[:count]
            padded.append(column)
        last = np.zeros((shape.seqs,), np.int32)
        last[:count] = batch.cu_q_lens[1 : count + 1] - 1
        next_tokens = following[: shape.tokens] if shape.prompt_logprobs else None
        return StepInputs(flat, batch._replace(slots=slots), last, RowSettings(*padded), next_tokens)

    read = sorted({page for table in tables[:in_small] for page in table})
    return inputs(small, in_small), inputs(full, len(q_lens)), np.asarray(read, np.int32)


def _lengths(rng: np.random.Generator, tokens: int, seqs: int, capacity: int) -> list[int]:
    """Random new-token counts of at most ``seqs`` sequences, ``tokens`` together: most 1 (decoding),
    the others prefill chunks of up to ``capacity``."""
    lengths: list[int] = []
    used = 0
    while len(lengths) < seqs and used < tokens:
        chunk = capacity >= 2 and rng.random() >= 0.6
        length = min(int(rng.integers(2, capacity + 1)) if chunk else 1, tokens - used)
        lengths.append(length)
        used += length
    return lengths


def written_pages(pool: object, pages: jax.Array) -> list[jax.Array]:
    """Each of the pool's arrays at ``pages`` (along its ``page`` axis), for comparing two programs'
    stores."""
    leaves = jax.tree.leaves(pool, is_leaf=lambda x: isinstance(x, NamedArray))
    return [_take_pages(leaf.array, pages, leaf.axis_names.index("page")) for leaf in leaves]


@functools.partial(jax.jit, static_argnums=(2,))
def _take_pages(array: jax.Array, pages: jax.Array, axis: int) -> jax.Array:
    return jnp.take(array, pages, axis=axis)


def results_agree(small: tuple, full: tuple, small_inputs: StepInputs) -> bool:
    """Whether a program's results for the probe's sequences equal the full-size program's bit for bit.

    Args:
        small, full: each program's ``(written pages, outputs)`` (`written_pages`; outputs sequences
            first, or tokens first for prompt log-probs; None where not computed).
        small_inputs: the smaller program's inputs (how many sequences and tokens are compared).
    """
    (small_pages, small_outputs), (full_pages, full_outputs) = small, full
    for a, b in zip(small_pages, full_pages, strict=True):
        if not bool(np.asarray(_same_bits(a, b))):
            return False
    seqs = int(small_inputs.batch.num_seqs)
    tokens = int(small_inputs.batch.cu_q_lens[seqs])
    for index, (a, b) in enumerate(zip(small_outputs, full_outputs, strict=True)):
        if a is None:
            continue
        count = seqs if index < 5 else tokens  # the drawn tokens' fields, then the prompt log-probs'
        here, there = np.asarray(a)[:count], np.ascontiguousarray(np.asarray(b)[:count])
        if here.shape != there.shape or here.tobytes() != there.tobytes():
            return False
    return True


@jax.jit
def _same_bits(small: jax.Array, full: jax.Array) -> jax.Array:
    """Whether two arrays are equal bit for bit."""
    unsigned = jnp.dtype(f"uint{small.dtype.itemsize * 8}")
    return jnp.array_equal(
        jax.lax.bitcast_convert_type(small, unsigned), jax.lax.bitcast_convert_type(full, unsigned)
    )
