"""The rows a GRPO step trains on: completions packed several to a row, or one to a row (padded).

Each sequence (a prompt and one of its completions) is laid out whole in one row of ``width`` tokens. Packed,
a row holds as many sequences as fit, each starting at a multiple of ``align`` tokens, with its own segment id
(attention stays inside it) and positions that restart at 0: the model computes each sequence's tokens as if
it were alone in its row. With ``align`` the attention kernel's key block (and the engine's page), every key
block holds one sequence's keys, so its per-token arithmetic is the padded row's and the sampler's
(``rl.deterministic`` keeps its bit-for-bit promise); without that promise sequences pack at any token.

The per-sequence arrays are ``[sequences, completion_tokens]`` (``completion_tokens = rl.max_new_tokens``):
completion token ``t`` of sequence ``s`` is predicted at the flat label position ``label_index[s, t]`` of its
microbatch's rows (padded: at label position ``label_index[s, t]`` of row ``s``, so any cut of the batch into
equal parts, `trainer.invariant`'s slices too, keeps each sequence with its row); the loss gathers the
log-probs there, so the policy loss sees one completion per row whatever the packing. The step splits every array of the batch into ``microbatches`` along its first axis
taking rows ``m, m + M, ...`` (`halyard.train.step.split_microbatches`): sequence ``s`` goes to microbatch
``s % M`` and is packed into that microbatch's rows, and its ``label_index`` counts within the microbatch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

PACKING_GAIN = 0.75
"""A step packs its rows only where they hold at most this share of the padded rows' tokens: packed rows
cost more per token (the attention kernel reads the segment ids; on CPU the ``blocked`` kernel walks its
blocks in a loop instead of unrolled pairs), so packing that saves less is slower (benchmarks/README.md)."""


@dataclass(frozen=True)
class PackedSequence:
    """One sequence to train on: its prompt, its completion, and the sampler's log-prob of each completion
    token."""

    prompt: list[int]
    completion: list[int]
    sampler_logps: list[float]

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.completion)


@dataclass(frozen=True)
class RowLayout:
    """How a step's sequences become rows.

    Attributes:
        width: tokens per row (labels: ``width - 1``).
        longest: the most tokens a sequence can have (the longest prompt and ``rl.max_new_tokens``).
        completion_tokens: the longest completion (``rl.max_new_tokens``).
        packed: several sequences per row; False: one per row (``width`` fits the longest).
        align: packed sequences start at multiples of this many tokens.
        microbatches: ``trainer.accumulation``.
        row_multiple: a microbatch's rows are a multiple of this (the batch's shards over the devices).
        gain: a step packs only where its rows hold at most this share of the padded rows' tokens.
    """

    width: int
    longest: int
    completion_tokens: int
    packed: bool = True
    align: int = 1
    microbatches: int = 1
    row_multiple: int = 1
    gain: float = PACKING_GAIN

    def __post_init__(self) -> None:
        if self.longest > self.width:
            raise ValueError(f"rows of {self.width} tokens cannot hold a sequence of {self.longest}")

    def slot(self, length: int) -> int:
        """The tokens a sequence of ``length`` takes in a packed row (its length rounded up to ``align``)."""
        return -(-length // self.align) * self.align

    def rows_for(self, needed: int, most: int) -> int:
        """A microbatch's row count for ``needed`` rows: the next step of `row_ladder` (at most a fifth of
        the rows padding, and few programs to compile), in multiples of ``row_multiple``, at most ``most``."""
        unit = self.row_multiple
        return min(next(size for size in row_ladder() if size * unit >= needed), -(-most // unit)) * unit


def row_ladder() -> Iterator[int]:
    """1, 2, 3, then four steps a doubling: 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ..."""
    yield from (1, 2, 3)
    scale = 1
    while True:
        yield from (4 * scale, 5 * scale, 6 * scale, 7 * scale)
        scale *= 2


def layout_rows(
    sequences: list[PackedSequence], advantages: np.ndarray, layout: RowLayout
) -> dict[str, np.ndarray]:
    """The step's arrays: ``tokens``, ``segment_ids`` and ``positions`` ``[rows, width]``; ``label_index``,
    ``completion_mask`` and ``sampler_logps`` ``[sequences, completion_tokens]``; ``advantages``
    ``[sequences]``. Padded (``layout.packed`` False, or packing that would save too little: ``layout.gain``),
    row ``s`` is sequence ``s``, ``layout.longest + 1`` tokens wide, and there are no segment ids or positions
    (the model's defaults).

    Raises:
        ValueError: a sequence longer than ``layout.longest``, or a sequence count that does not split into microbatches.
    """
    count, micro, width = len(sequences), layout.microbatches, layout.width
    if count % micro:
        raise ValueError(f"{count} sequences do not split into trainer.accumulation={micro} microbatches")
    longest = max(s.length for s in sequences)
    if longest > layout.longest:
        raise ValueError(f"a sequence of {longest} tokens is longer than the {layout.longest} rows allow")
    per_micro = count // micro
    places = [_places(sequences[m::micro], layout) for m in range(micro)]
    if layout.packed:  # at most: every sequence as long as it can be
        most = -(-per_micro // max(1, width // layout.slot(layout.longest)))
        rows = layout.rows_for(max(max(r for _, r in p) + 1 for p in places), most)
        if rows * width > layout.gain * per_micro * (layout.longest + 1):  # too little saved: padded rows
            padded = dataclasses.replace(layout, packed=False, width=layout.longest + 1)
            return layout_rows(sequences, advantages, padded)
    else:
        rows = per_micro
    tokens = np.zeros((rows * micro, width), np.int32)
    segments = np.zeros((rows * micro, width), np.int32)
    positions = np.zeros((rows * micro, width), np.int32)
    label_index = np.zeros((count, layout.completion_tokens), np.int32)
    mask = np.zeros((count, layout.completion_tokens), np.int32)
    sampler = np.zeros((count, layout.completion_tokens), np.float32)
    for m in range(micro):
        for j, ((start, row), sequence) in enumerate(zip(places[m], sequences[m::micro], strict=True)):
            s, r = j * micro + m, row * micro + m  # the batch's slot and row (`split_microbatches`' order)
            end, first = start + sequence.length, start + len(sequence.prompt)
            tokens[r, start:end] = sequence.prompt + sequence.completion
            segments[r, start:end] = j + 1
            positions[r, start:end] = np.arange(sequence.length)
            size = len(sequence.completion)
            offset = row * (width - 1) if layout.packed else 0  # padded: within the sequence's own row
            label_index[s, :size] = offset + np.arange(first - 1, first - 1 + size)
            mask[s, :size] = 1
            sampler[s, :size] = sequence.sampler_logps
    arrays = {
        "tokens": tokens,
        "label_index": label_index,
        "completion_mask": mask,
        "sampler_logps": sampler,
        "advantages": advantages.reshape(-1).astype(np.float32),
    }
    if layout.packed:
        arrays.update(segment_ids=segments, positions=positions)
    return arrays


def _places(sequences: list[PackedSequence], layout: RowLayout) -> list[tuple[int, int]]:
    """``(start, row)`` of each of a microbatch's sequences: padded, its own row; packed, the first row with
    room at its end (first fit, in order)."""
    if not layout.packed:
        return [(0, row) for row in range(len(sequences))]
    ends: list[int] = []  # the first free token of each row
    places = []
    for sequence in sequences:
        needed = layout.slot(sequence.length)
        row = next((r for r, end in enumerate(ends) if end + sequence.length <= layout.width), len(ends))
        if row == len(ends):
            ends.append(0)
        places.append((ends[row], row))
        ends[row] += needed
    return places


def alignment(deterministic: bool, page_size: int, attention_block: int) -> int:
    """Where packed sequences may start: with the bit-for-bit promise (``rl.deterministic``), at the
    multiples of the engine's page and of the training attention kernel's key block (a key block then never
    holds two sequences' keys); otherwise anywhere."""
    return math.lcm(page_size, attention_block) if deterministic else 1
