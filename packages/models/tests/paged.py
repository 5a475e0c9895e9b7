"""Run a model chunk by chunk against a `PagedKV`, as an inference engine does (for the tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM
from halyard.named import NamedArray, named


@jax.jit
def _step(model: CausalLM, tokens: jax.Array, positions: jax.Array, pages, table: jax.Array):
    capacity = table.shape[1] * pages.page_size
    pages = pages.for_rows(table, jnp.where(positions >= 0, positions, capacity))
    hidden, written = model.paged_step(
        named(tokens, ("batch", "pos")), positions=named(positions, ("batch", "pos")), pages=pages
    )
    return model.logits(hidden).unwrap("batch", "pos", "vocab"), pages.written(*written).without_rows()


def paged_logits(
    model: CausalLM, tokens: NamedArray, stops: list[int], *, page_size: int = 4, seed: int = 0
) -> np.ndarray:
    """Logits of ``tokens (batch, pos)`` fed in chunks ending at ``stops``, each row's pages drawn at random
    from a shared pool, every chunk with one padding token after it (position -1: never stored).

    Returns:
        ``[batch, pos, vocab]`` float32.
    """
    batch, length = tokens.axis_size("batch"), tokens.axis_size("pos")
    per_row = -(-length // page_size)
    order = np.random.default_rng(seed).permutation(batch * per_row + 3)
    table = jnp.asarray(order[: batch * per_row].reshape(batch, per_row), jnp.int32)
    pages = model.init_pages(batch * per_row + 3, page_size)
    plain = np.asarray(tokens.unwrap("batch", "pos"))
    pieces, start = [], 0
    for stop in stops:
        chunk = np.concatenate([plain[:, start:stop], np.zeros((batch, 1), np.int32)], axis=1)
        positions = np.concatenate(
            [
                np.broadcast_to(np.arange(start, stop, dtype=np.int32), (batch, stop - start)),
                np.full((batch, 1), -1, np.int32),
            ],
            axis=1,
        )
        logits, pages = _step(model, jnp.asarray(chunk), jnp.asarray(positions), pages, table)
        pieces.append(np.asarray(logits)[:, : stop - start])
        start = stop
    return np.concatenate(pieces, axis=1)


def paged_greedy(
    model: CausalLM, prompt: list[int], new_tokens: int, *, page_size: int = 4
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation through the pages: the prompt in one chunk, then one token a step.

    Returns:
        ``(the generated tokens, the logits each was chosen from [new_tokens, vocab])``.
    """
    total = len(prompt) + new_tokens
    per_row = -(-total // page_size)
    table = jnp.asarray([list(range(per_row))[::-1]], jnp.int32)  # pages in reverse pool order
    pages = model.init_pages(per_row, page_size)
    tokens, chosen_from = list(prompt), []
    chunk, start = list(prompt), 0
    for _ in range(new_tokens):
        positions = np.arange(start, start + len(chunk), dtype=np.int32)[None]
        logits, pages = _step(model, jnp.asarray([chunk], jnp.int32), jnp.asarray(positions), pages, table)
        last = np.asarray(logits)[0, -1]
        chosen_from.append(last)
        start += len(chunk)
        chunk = [int(np.argmax(last))]
        tokens.append(chunk[0])
    return tokens[len(prompt) :], np.stack(chosen_from)
