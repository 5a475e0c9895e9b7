"""One ragged engine step for the paged kernels' tests, and its dense reference in numpy.

The step: a prefill chunk after 8 cached tokens, a decode row that shares the chunk's first page (a prefix
cache hit), a fresh 3-token prompt whose last key sits in the pool's very last slot (where a padding slot
of -1 would land if it wrapped around), then padding tokens and a padding sequence slot. Keys and values
live per pool slot: a sequence's key at position ``p`` is the key in slot ``pages[p // page_size] *
page_size + p % page_size``, so shared pages give shared keys. The step is written into layer 1 over a
layer 0 of other keys, so a kernel that reads the wrong layer fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from float_tolerance import attention_terms

PAGE_SIZE = 8
HEAD_SIZE = 64  # below the kernel's 128 lanes: the padding to 128 is part of what is tested
QUERY_HEADS, KV_HEADS = 4, 2
LAYERS, PAGES = 2, 12
STEP_LAYER = 1
TOKENS, SEQS, TABLE_WIDTH = 12, 4, 3
SEQUENCES = (  # (q_len, kv_len, pages)
    (5, 13, (3, 7)),  # a prefill chunk after 8 cached tokens
    (1, 20, (3, 9, 4)),  # a decode row sharing page 3 (positions 0-7) with the chunk
    (3, 8, (11,)),  # a fresh prompt: its last key is the pool's last slot
)
SCALE = 0.125


@dataclasses.dataclass(frozen=True)
class RaggedStep:
    """The step's inputs (numpy) and each layer's key and value per pool slot."""

    page_size: int
    query: np.ndarray  # [T, Hq, d]
    slot_keys: np.ndarray  # [layers, pages * page_size, h, d]
    slot_values: np.ndarray
    history_slots: np.ndarray  # [N]: the slots holding keys from before the step
    slots: np.ndarray  # [T]: the step's tokens' slots, -1 for padding
    page_table: np.ndarray  # [S, J]
    cu_q_lens: np.ndarray  # [S + 1]
    kv_lens: np.ndarray  # [S]
    num_seqs: np.ndarray  # []

    def step_keys(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The step's tokens' keys and values ``[T, h, d]``; padding tokens get large values (never stored)."""
        slots = np.where(self.slots >= 0, self.slots, 0)
        keys, values = self.slot_keys[layer, slots], self.slot_values[layer, slots]
        padding = (self.slots < 0)[:, None, None]
        return np.where(padding, 1e3, keys), np.where(padding, -1e3, values)


def ragged_step(
    dtype: Any,
    query_heads: int = QUERY_HEADS,
    kv_heads: int = KV_HEADS,
    page_size: int = PAGE_SIZE,
    seed: int = 0,
) -> RaggedStep:
    """The step of the module docstring, its floats rounded to ``dtype``, with ``query_heads`` on ``kv_heads``.
    A ``page_size`` above `PAGE_SIZE` keeps each sequence's pages (the later ones unused), so the shared page
    then also holds the chunk's new keys."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(dtype)

    slots = np.full((TOKENS,), -1, np.int32)
    history: list[int] = []
    table = np.zeros((SEQS, TABLE_WIDTH), np.int32)
    cu_q_lens = np.zeros((SEQS + 1,), np.int32)
    kv_lens = np.zeros((SEQS,), np.int32)
    start = 0
    for index, (q_len, kv_len, pages) in enumerate(SEQUENCES):
        positions = np.arange(kv_len)
        owned = np.asarray(pages)[positions // page_size] * page_size + positions % page_size
        history.extend(owned[: kv_len - q_len])
        slots[start : start + q_len] = owned[kv_len - q_len :]
        table[index, : len(pages)] = pages
        kv_lens[index] = kv_len
        start += q_len
        cu_q_lens[index + 1 :] = start
    slot_count = PAGES * page_size
    return RaggedStep(
        page_size=page_size,
        query=normal(TOKENS, query_heads, HEAD_SIZE),
        slot_keys=normal(LAYERS, slot_count, kv_heads, HEAD_SIZE),
        slot_values=normal(LAYERS, slot_count, kv_heads, HEAD_SIZE),
        history_slots=np.unique(np.asarray(history, np.int32)),
        slots=slots,
        page_table=table,
        cu_q_lens=cu_q_lens,
        kv_lens=kv_lens,
        num_seqs=np.asarray(len(SEQUENCES), np.int32),
    )


def dense_reference(
    step: RaggedStep, layer: int, *, sliding_window: int | None, logit_softcap: float | None
) -> np.ndarray:
    """``[T, Hq, d]`` in float64: each real token's causal attention over its sequence's keys, gathered
    position by position through its pages; padding tokens 0."""
    keys = step.slot_keys[layer].astype(np.float64)
    values = step.slot_values[layer].astype(np.float64)
    query_heads, kv_heads = step.query.shape[1], step.slot_keys.shape[2]
    group = query_heads // kv_heads
    output = np.zeros(step.query.shape, np.float64)
    for sequence in range(int(step.num_seqs)):
        first, last = step.cu_q_lens[sequence], step.cu_q_lens[sequence + 1]
        kv_len = int(step.kv_lens[sequence])
        positions = np.arange(kv_len)
        page_size = step.page_size
        slots = step.page_table[sequence][positions // page_size] * page_size + positions % page_size
        for token in range(first, last):
            position = kv_len - (last - first) + (token - first)
            seen = positions <= position
            if sliding_window is not None:
                seen &= positions > position - sliding_window
            for head in range(query_heads):
                query = step.query[token, head].astype(np.float64)
                logits = SCALE * keys[slots, head // group] @ query
                if logit_softcap is not None:
                    logits = logit_softcap * np.tanh(logits / logit_softcap)
                weights = np.exp(np.where(seen, logits - logits[seen].max(), -np.inf))
                output[token, head] = weights @ values[slots, head // group] / weights.sum()
    return output


def reference_terms() -> int:
    """The reductions along one output value (`float_tolerance.summation_tolerance`'s ``terms``):
    `float_tolerance.attention_terms` over the longest sequence's keys (the logit's dot product, a soft-cap's
    tanh and the softmax's exp, the softmax's sum and the weighted values), its pages the key blocks of an
    online softmax (one a page at most)."""
    longest = max(kv_len for _, kv_len, _ in SEQUENCES)
    return attention_terms(HEAD_SIZE, longest, key_blocks=-(-longest // PAGE_SIZE))
