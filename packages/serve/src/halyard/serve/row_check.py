"""Whether a program of fewer tokens gives every sequence the same bits as the full-size program: the tests'
check of deterministic mode's batch invariance (`halyard.serve.runner`).

A deterministic engine's programs compute each token with arithmetic whose order does not depend on the batch
(`halyard.named.nn.batch_invariant`), so any program size gives a sequence the same bits; nothing is probed
when an engine starts. These probes are how the tests show it: both programs run random probes (decoding
tokens and prefill chunks of random sequences over random pages of the pool, a mix of greedy, top-k, top-p
and min-p sequences), and every output of every probe sequence and every page it stores must agree bit for
bit. One run of the full program holds several runs of the smaller one side by side, each group of sequences
on pages of its own and at its own place in the batch (as a request sits anywhere among others), then
sequences that store nothing. In float32 another summation order shows in the last bits of nearly every
random row; in bfloat16 the rounding of the compute dtype hides it in most rows (a 1-token program of a
bfloat16 Qwen2 of the fast mode differed from the full one in about a quarter of random rows), so the probes
go on until `PROBE_ROWS` sequences were compared.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models.attention.ragged_paged import PADDING_SLOT, ragged_batch
from halyard.serve.program import ProgramShape, StepInputs, StepOutputs, no_adjustments
from halyard.serve.sampler import RowSettings

if TYPE_CHECKING:
    from halyard.serve.runner import ModelRunner

PROBE_SEED = 20261205
"""The first probe's fixed seed (the next ones count up from it): every process of a multi-process engine
builds the same probes."""
_PADDED_TOKEN = StepOutputs._fields.index("padded_token")
PROBE_ROWS = 32
"""Sequences a row check compares at least, over as many probes as that takes (a 1-token program: 32 runs of
it beside as few runs of the full program as hold 32 groups)."""


def rows_agree(runner: ModelRunner, shape: ProgramShape, rows: int = PROBE_ROWS) -> bool:
    """Whether ``shape``'s program gives every probed sequence the bits the program of ``runner``'s most tokens
    (at the same pages and variants) gives it, over at least ``rows`` sequences (see the module docstring)."""
    full = dataclasses.replace(shape, tokens=runner.max_tokens, seqs=min(runner.max_tokens, runner.max_seqs))
    compared, probe = 0, 0
    while compared < rows:
        groups, full_inputs = probe_inputs(
            full, shape, runner.page_size, runner.num_pages, runner.vocab_size, probe, rows - compared
        )
        full_pages, full_outputs = runner.results(full, full_inputs, [group.pages for group in groups])
        for group, pages in zip(groups, full_pages, strict=True):
            (small_pages,), small_outputs = runner.results(shape, group.inputs, [group.pages])
            first = (group.first_seq, group.first_token)
            if not results_agree((small_pages, small_outputs), (pages, full_outputs), group.inputs, *first):
                return False
            compared += int(group.inputs.batch.num_seqs)
        probe += 1
    return True


class ProbeGroup(NamedTuple):
    """One run of the smaller program in a probe.

    Attributes:
        inputs: the smaller program's inputs.
        pages: the pages its sequences read and write (no other group's sequence writes them).
        first_seq, first_token: where its sequences and tokens sit in the full program's batch.
    """

    inputs: StepInputs
    pages: np.ndarray
    first_seq: int
    first_token: int


def probe_inputs(
    full: ProgramShape,
    small: ProgramShape,
    page_size: int,
    num_pages: int,
    vocab: int,
    probe: int = 0,
    rows: int = 1,
) -> tuple[list[ProbeGroup], StepInputs]:
    """Random inputs of ``full`` and of ``small`` (see the module docstring). ``full`` holds groups of
    sequences, each one run of ``small`` leaving at least one token and one slot of it as padding, until they
    hold ``rows`` sequences or the next group does not fit (the first always does); then sequences that store
    nothing. Each group reads and writes pages of its own (while the pool has enough), so its sequences see
    the same pages alone in ``small`` as among the others in ``full``. ``probe`` numbers the probe (its seed
    is ``PROBE_SEED + probe``).

    Returns:
        ``(the groups, full's inputs)``.
    """
    rng = np.random.default_rng(PROBE_SEED + probe)
    capacity = full.seq_pages * page_size
    unused = rng.permutation(num_pages).tolist()  # pages no group has taken yet
    q_lens: list[int] = []
    kv_lens: list[int] = []
    tables: list[list[int]] = []
    groups: list[tuple[int, list[int]]] = []  # each group's first sequence and its pages
    while len(q_lens) < rows or not groups:
        lengths = _lengths(rng, max(1, small.tokens - 1), max(1, small.seqs - 1), capacity)
        kvs = [int(rng.integers(q, capacity + 1)) for q in lengths]
        counts = [-(-kv // page_size) for kv in kvs]
        fits = len(q_lens) + len(lengths) <= full.seqs and sum(q_lens) + sum(lengths) <= full.tokens
        if groups and (not fits or sum(counts) > len(unused)):
            break
        owned = (
            unused[: sum(counts)] if sum(counts) <= len(unused) else rng.integers(0, num_pages, sum(counts))
        )
        del unused[: sum(counts)]  # a pool too small for the first group: its pages repeat, and it is alone
        groups.append((len(q_lens), sorted({int(page) for page in owned})))
        for q_len, kv_len, count in zip(lengths, kvs, counts, strict=True):
            q_lens.append(q_len)
            kv_lens.append(kv_len)
            tables.append([int(page) for page in owned[:count]])
            owned = owned[count:]
    stored = len(q_lens)
    for q_len in _lengths(rng, full.tokens - sum(q_lens), full.seqs - stored, capacity):
        kv_lens.append(int(rng.integers(q_len, capacity + 1)))
        q_lens.append(q_len)
        tables.append(rng.integers(0, num_pages, -(-kv_lens[-1] // page_size)).tolist())
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
    following = rng.integers(-1, vocab, full.tokens + small.tokens).astype(np.int32)
    # a program with grammar masks: each row's own random mask (the full program's rows the same)
    masks = rng.integers(-(2**31), 2**31, (len(q_lens), full.mask_words), dtype=np.int64).astype(np.int32)

    def inputs(shape: ProgramShape, first: int, count: int, storing: int) -> StepInputs:
        """``shape``'s inputs of sequences ``first`` to ``first + count``, the first ``storing`` of them
        storing their keys and values."""
        chosen = slice(first, first + count)
        batch = ragged_batch(
            q_lens[chosen], kv_lens[chosen], tables[chosen],
            page_size=page_size, tokens=shape.tokens, seqs=shape.seqs, pages=shape.seq_pages,
        )  # fmt: skip
        slots = batch.slots.copy()
        slots[batch.cu_q_lens[storing] :] = PADDING_SLOT
        flat = np.zeros((shape.tokens,), np.int32)
        flat[: batch.cu_q_lens[count]] = np.concatenate(tokens[chosen])
        padded = []
        for field, fill in zip(settings, (0, 0, 1, 0, 0, 0, 0)):
            column = np.full((shape.seqs, *field.shape[1:]), fill, field.dtype)
            column[:count] = field[chosen]
            padded.append(column)
        last = np.zeros((shape.seqs,), np.int32)
        last[:count] = batch.cu_q_lens[1 : count + 1] - 1
        start = sum(q_lens[:first])
        next_tokens = following[start : start + shape.tokens] if shape.prompt_logprobs else None
        adjustments = None
        if shape.mask_words:
            adjustments = no_adjustments(shape.seqs, shape.mask_words)
            adjustments.allowed[:count] = masks[chosen]
        return StepInputs(
            flat,
            batch._replace(slots=slots),
            last,
            RowSettings(*padded),
            next_tokens,
            adjustments=adjustments,
        )

    bounds = [first for first, _ in groups] + [stored]
    runs = [
        ProbeGroup(
            inputs(small, first, end - first, end - first),
            np.asarray(pages, np.int32),
            first,
            sum(q_lens[:first]),
        )
        for (first, pages), end in zip(groups, bounds[1:], strict=True)
    ]
    return runs, inputs(full, 0, len(q_lens), stored)


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


def results_agree(
    small: tuple, full: tuple, small_inputs: StepInputs, first_seq: int = 0, first_token: int = 0
) -> bool:
    """Whether a program's results for the probe's sequences equal the full-size program's bit for bit.

    Args:
        small, full: each program's ``(written pages, outputs)`` (`halyard.serve.runner.written_pages` of the group's pages;
            outputs sequences first, or tokens first for prompt log-probs; None where not computed).
        small_inputs: the smaller program's inputs (how many sequences and tokens are compared).
        first_seq, first_token: where those sequences and tokens sit in the full program's outputs.
    """
    (small_pages, small_outputs), (full_pages, full_outputs) = small, full
    for a, b in zip(small_pages, full_pages, strict=True):
        if not bool(np.asarray(_same_bits(a, b))):
            return False
    seqs = int(small_inputs.batch.num_seqs)
    tokens = int(small_inputs.batch.cu_q_lens[seqs])
    for index, (a, b) in enumerate(zip(small_outputs, full_outputs, strict=True)):
        if a is None or index == _PADDED_TOKEN:  # the drawn tokens again, padded for the next program
            continue
        count, first = (seqs, first_seq) if index < 5 else (tokens, first_token)  # drawn tokens', prompt's
        here = np.asarray(a)[:count]
        there = np.ascontiguousarray(np.asarray(b)[first : first + count])
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
