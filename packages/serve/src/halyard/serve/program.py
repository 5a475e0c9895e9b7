"""A step program's static shape, its inputs and its outputs, as the `ModelRunner` runs them.

A step is one flat batch of ``tokens`` tokens of at most ``seqs`` sequences, each reading at most
``seq_pages`` pages (`halyard.models.attention.ragged_paged`: padding tokens last, slot -1)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from halyard.models.attention.ragged_paged import RaggedBatch
from halyard.serve.params import MAX_LOGIT_BIAS
from halyard.serve.sampler import LogitAdjustments, RowSettings


class StepInputs(NamedTuple):
    """One program's inputs (numpy, host side).

    Attributes:
        tokens: int32 ``[tokens]``: the flat batch.
        batch: its layout (`RaggedBatch`: positions, slots, page table, ``cu_q_lens``, ``kv_lens``).
        last: int32 ``[seqs]``: the flat index of the token each sequence draws its next token after.
        settings: the sequences' `RowSettings` (``[seqs]`` each).
        next_tokens: int32 ``[tokens]``: the token following each fed token (for prompt log-probs), -1 where
            unknown; None when no sequence asks for prompt log-probs.
        fed_from: int32 ``[tokens]``: where ``tokens`` holds a placeholder, the row of ``previous`` whose drawn
            token goes there; -1 elsewhere (None: nothing fed; the runner fills in -1).
        previous: int32 ``[max_seqs]``: the previous program's drawn tokens, still on the device
            (`StepOutputs.padded_token`); None with ``fed_from``.
        adjustments: the rows' grammar masks and logit biases (`LogitAdjustments`); None in a program
            without (`ProgramShape.mask_words` 0).
        adapters: int32 ``[tokens]``: each token's LoRA adapter (`halyard.serve.adapters`; 0 the base and
            padding); None in a program without (`ProgramShape.adapters` False).
    """

    tokens: np.ndarray
    batch: RaggedBatch
    last: np.ndarray
    settings: RowSettings
    next_tokens: np.ndarray | None
    fed_from: np.ndarray | None = None
    previous: Any = None
    adjustments: LogitAdjustments | None = None
    adapters: np.ndarray | None = None


class StepOutputs(NamedTuple):
    """One program's results, on the device until fetched (`fetched`): the drawn token per sequence and
    its log-probabilities (`halyard.serve.sampler.Drawn`), the top alternatives when asked for
    (``[seqs, 20]``), the prompt log-probs when asked for (``[tokens]`` and ``[tokens, 20]``), and the drawn
    tokens padded to ``[max_seqs]`` (the next program's ``previous``)."""

    token: Any
    logprob: Any
    sampled_logprob: Any
    top_tokens: Any
    top_logprobs: Any
    next_logprob: Any
    next_top_tokens: Any
    next_top_logprobs: Any
    padded_token: Any = None


def round_up_power_of_two(value: int, smallest: int = 1) -> int:
    """The smallest power of two at least ``value`` and ``smallest``."""
    size = max(1, smallest)
    while size < value:
        size *= 2
    return size


HALF_STEPS_FROM = 48
"""The smallest token count halfway between two of the ladder's powers of two (`token_ladder`)."""


def token_ladder(smallest: int, largest: int) -> list[int]:
    """The token counts of a runner's programs without ``token_buckets``: ``smallest`` times powers of two
    and, from `HALF_STEPS_FROM` up, 1.5 times each (48, 96, 192, ...: a step's program is then at most a
    third padding, not half), below ``largest``, then ``largest``."""
    steps = doubling_sizes(smallest, largest)[:-1]
    halves = [size * 3 // 2 for size in steps if size * 3 // 2 >= HALF_STEPS_FROM]
    return [*sorted({*steps, *(size for size in halves if size < largest)}), largest]


def doubling_sizes(smallest: int, largest: int) -> list[int]:
    """The sizes `round_up_power_of_two` gives from ``smallest`` (``smallest`` times powers of two) below
    ``largest``, then ``largest``."""
    sizes = []
    size = round_up_power_of_two(1, smallest)
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


@dataclasses.dataclass(frozen=True)
class ProgramShape:
    """The static shape of one compiled step program.

    Attributes:
        tokens: the flat batch's tokens (a bucket).
        seqs: its sequence slots.
        seq_pages: the pages one sequence can read (a bucket).
        prompt_logprobs: whether it computes every token's successor log-probability.
        alternatives: whether it computes each drawn token's top alternatives.
        mask_words: the int32 words of a row's token mask (its vocabulary over 32) in a program that takes
            grammar masks and logit biases (`LogitAdjustments`); 0 in one that takes none.
        draws: the tokens each row draws: after its last token (``StepInputs.last``) and the ``draws - 1``
            tokens fed after it (a speculative row's proposals, `halyard.serve.speculation`); with more than
            one, the drawn tokens and their log-probs come back ``[seqs, draws]``.
        adapters: whether it runs LoRA adapters (takes `StepInputs.adapters`; `halyard.serve.adapters`): a
            step whose rows are all the base's runs the program without, which computes no adapter.
    """

    tokens: int
    seqs: int
    seq_pages: int
    prompt_logprobs: bool
    alternatives: bool = False
    mask_words: int = 0
    draws: int = 1
    adapters: bool = False


def mask_words(vocab_size: int) -> int:
    """The int32 words of one row's token bitmask (32 tokens a word; `ProgramShape.mask_words`)."""
    return (vocab_size + 31) // 32


def example_inputs(shape: ProgramShape) -> StepInputs:
    """Inputs of ``shape`` that are all padding: a program run on them stores nothing."""
    seqs, tokens = shape.seqs, shape.tokens
    int_seqs = np.zeros((seqs,), np.int32)
    settings = RowSettings(
        temperature=np.zeros((seqs,), np.float32),
        top_k=int_seqs,
        top_p=np.ones((seqs,), np.float32),
        min_p=np.zeros((seqs,), np.float32),
        seed=np.zeros((seqs, 2), np.uint32),
        sample=int_seqs,
        position=int_seqs,
    )
    batch = RaggedBatch(
        positions=np.full((tokens,), -1, np.int32),
        slots=np.full((tokens,), -1, np.int32),
        page_table=np.zeros((seqs, shape.seq_pages), np.int32),
        cu_q_lens=np.zeros((seqs + 1,), np.int32),
        kv_lens=int_seqs,
        num_seqs=np.asarray(0, np.int32),
    )
    return StepInputs(
        tokens=np.zeros((tokens,), np.int32),
        batch=batch,
        last=int_seqs,
        settings=settings,
        next_tokens=np.zeros((tokens,), np.int32) if shape.prompt_logprobs else None,
        adjustments=no_adjustments(seqs, shape.mask_words) if shape.mask_words else None,
        adapters=np.zeros((tokens,), np.int32) if shape.adapters else None,
    )


def no_adjustments(seqs: int, mask_words: int) -> LogitAdjustments:
    """`LogitAdjustments` of ``seqs`` rows that allow every token and bias none."""
    return LogitAdjustments(
        allowed=np.full((seqs, mask_words), -1, np.int32),
        bias_tokens=np.full((seqs, MAX_LOGIT_BIAS), mask_words * 32, np.int32),
        bias_values=np.zeros((seqs, MAX_LOGIT_BIAS), np.float32),
    )
