"""OpenAI's response pieces built from engine outputs: log-probs in the completions and the chat forms,
usage, server-sent events."""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from halyard.serve.outputs import TopLogprobs
from halyard.serve.server.errors import APIError
from halyard.serve.server.tokenizer import TextTokenizer

LOWEST_LOGPROB = -9999.0
"""Stands for a log-probability of minus infinity (JSON has no infinity)."""


def new_id(prefix: str) -> str:
    """A response id such as ``cmpl-3f2a...``."""
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    """OpenAI's ``created``: seconds since the epoch."""
    return int(time.time())


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOWEST_LOGPROB


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def event(data: dict[str, Any]) -> str:
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
"""The event that ends every stream."""


async def event_stream(
    chunks: AsyncIterator[dict[str, Any]], on_exit: Callable[[], None]
) -> AsyncIterator[str]:
    """A stream's chunks as server-sent events: an error event when the request cannot finish (OpenAI's
    error object), then ``[DONE]``.

    Args:
        chunks: the stream's JSON chunks; may raise `APIError`.
        on_exit: runs however the stream ends (cancels the requests of a client that left).
    """
    try:
        async for chunk in chunks:
            yield event(chunk)
    except APIError as error:
        yield event(error.body())
    finally:
        on_exit()
    yield DONE


def completion_logprobs(
    tokenizer: TextTokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top: Sequence[TopLogprobs | None],
    offset: int,
) -> dict[str, Any]:
    """The completions API's ``logprobs`` object.

    Args:
        tokenizer: gives each token's text.
        token_ids, logprobs, top: per token: its id, its log-probability (None for a prompt's first
            token) and the most likely alternatives (None likewise). The sampled token is added to the
            alternatives when not among them, as OpenAI does (up to ``logprobs + 1`` entries).
        offset: the character offset of the first token in the choice's text.
    """
    tokens = [tokenizer.token_text(token) for token in token_ids]
    text_offset = []
    for text in tokens:
        text_offset.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = []
    for token, logprob, alternatives in zip(tokens, logprobs, top):
        if alternatives is None or logprob is None:
            tops.append(None)
            continue
        entries = {tokenizer.token_text(t): finite(v) for t, v in alternatives}
        entries.setdefault(token, finite(logprob))
        tops.append(entries)
    return {
        "tokens": tokens,
        "token_logprobs": [None if v is None else finite(v) for v in logprobs],
        "top_logprobs": tops,
        "text_offset": text_offset,
    }


def chat_logprobs(
    tokenizer: TextTokenizer, token_ids: Sequence[int], logprobs: Sequence[float], top: Sequence[TopLogprobs]
) -> list[dict[str, Any]]:
    """The chat API's ``logprobs.content`` entries: each token with its bytes and its alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.token_text(token_id)
        return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode("utf-8"))}

    return [
        {**entry(token, logprob), "top_logprobs": [entry(t, v) for t, v in alternatives]}
        for token, logprob, alternatives in zip(token_ids, logprobs, top)
    ]
