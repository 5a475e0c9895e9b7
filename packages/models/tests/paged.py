"""Run a model chunk by chunk against a `PagedKV`, as an inference engine does (for the tests)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from halyard.models import CausalLM
from halyard.models.attention.ragged_paged import ragged_batch
from halyard.named import named


@functools.partial(jax.jit, donate_argnums=(2,))
def _step(model: CausalLM, tokens: jax.Array, pages, batch):
    hidden, pages = model.paged_step(named(tokens, ("pos",)), pages=pages.for_step(batch))
    return model.logits(hidden).unwrap("pos", "vocab"), pages.without_step()


def _run(
    model: CausalLM,
    pages,
    chunks: list[list[int]],
    starts: list[int],
    tables,
    page_size: int,
    tokens: int | None = None,
    table_pages: int | None = None,
):
    """One flat step of ``chunks`` (sequence ``i``'s tokens from position ``starts[i]``) and padding tokens
    (one, or up to ``tokens``), the tables padded to ``table_pages`` pages (default: the longest table's);
    returns ``(each chunk's logits, the pool)``."""
    q_lens = [len(chunk) for chunk in chunks]
    total = max(sum(q_lens) + 1, tokens or 0)
    pages_needed = max([len(table) for table in tables] + [table_pages or 0])
    batch = ragged_batch(
        q_lens, [s + q for s, q in zip(starts, q_lens)], tables,
        page_size=page_size, tokens=total, seqs=len(chunks) + 1, pages=pages_needed,
    )  # fmt: skip
    flat = np.zeros((total,), np.int32)
    flat[: sum(q_lens)] = np.concatenate(chunks)
    logits, pages = _step(model, flat, pages, batch)
    logits, pieces, start = np.asarray(logits), [], 0
    for q_len in q_lens:
        pieces.append(logits[start : start + q_len])
        start += q_len
    return pieces, pages


def paged_logits(
    model: CausalLM, tokens, stops: list[int], *, page_size: int = 4, seed: int = 0
) -> np.ndarray:
    """Logits of ``tokens (batch, pos)`` fed in chunks ending at ``stops`` (every row's chunk in one flat
    step, then a padding token), each row's pages drawn at random from a shared pool.

    Returns:
        ``[batch, pos, vocab]`` float32.
    """
    batch, length = tokens.axis_size("batch"), tokens.axis_size("pos")
    per_row = -(-length // page_size)
    order = np.random.default_rng(seed).permutation(batch * per_row + 3)
    tables = order[: batch * per_row].reshape(batch, per_row).tolist()
    pages = model.init_pages(batch * per_row + 3, page_size)
    plain = np.asarray(tokens.unwrap("batch", "pos"))
    pieces, start = [], 0
    for stop in stops:
        chunks = [plain[row, start:stop].tolist() for row in range(batch)]
        logits, pages = _run(model, pages, chunks, [start] * batch, tables, page_size)
        pieces.append(np.stack(logits))
        start = stop
    return np.concatenate(pieces, axis=1)


def paged_greedy(
    model: CausalLM,
    prompt: list[int],
    new_tokens: int,
    *,
    page_size: int = 4,
    step_tokens: int | None = None,
    pool_pages: int | None = None,
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation through the pages: the prompt in one chunk, then one token a step.

    Args:
        step_tokens, pool_pages: every step padded to ``step_tokens`` tokens, in a pool of ``pool_pages``
            pages that every table is padded to (one compiled step for prompts of several lengths);
            default: the fewest this prompt needs.

    Returns:
        ``(the generated tokens, the logits each was chosen from [new_tokens, vocab])``.
    """
    total = len(prompt) + new_tokens
    per_row = -(-total // page_size)
    table = list(range(per_row))[::-1]  # pages in reverse pool order
    pages = model.init_pages(max(per_row, pool_pages or 0), page_size)
    tokens, chosen_from = list(prompt), []
    chunk, start = list(prompt), 0
    for _ in range(new_tokens):
        (logits,), pages = _run(model, pages, [chunk], [start], [table], page_size, step_tokens, pool_pages)
        last = logits[-1]
        chosen_from.append(last)
        start += len(chunk)
        chunk = [int(np.argmax(last))]
        tokens.append(chunk[0])
    return tokens[len(prompt) :], np.stack(chosen_from)
