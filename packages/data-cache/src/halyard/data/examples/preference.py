"""Preference pairs: a prompt with a chosen and a rejected reply, rendered as two chats (DPO data).

A record ``{"prompt": ..., "chosen": ..., "rejected": ...}`` becomes two examples, ``prompt + chosen`` and
``prompt + rejected``, whose targets are the reply only. A string prompt is one user message and a string
reply one assistant message; TRL's conversational form works too (the prompt a list of messages, each reply
a list of assistant messages). Both examples are rendered with the format's chat template (the simple
markers, or the tokenizer's own template), so the prompt's tokens are the same in both.
"""

from __future__ import annotations

from typing import Any

from halyard.data.examples.chat_rendering import ChatRendering
from halyard.data.examples.messages import Segments, checked_messages, required_field
from halyard.data.sources.records import ExampleError


def preference_segments(
    value: Any,
    where: str,
    rendering: ChatRendering,
    *,
    prompt_field: str,
    chosen_field: str,
    rejected_field: str,
    role_field: str,
    content_field: str,
) -> tuple[Segments, Segments]:
    """The chosen and the rejected example of one preference record, as target/non-target segments.

    Args:
        value: the parsed JSON object.
        where: ``file:line`` for messages.
        rendering: the chat template both examples are rendered with.
        prompt_field, chosen_field, rejected_field: the keys of the prompt and of the two replies.
        role_field, content_field: the keys of a message's role and text (conversational records).

    Raises:
        MissingFieldError: the prompt, chosen or rejected field is absent (names it and the keys found).
        ExampleError: a field of the wrong type, a reply message that is not the assistant's, or a
            tokenizer template that cannot locate the reply.
    """
    if not isinstance(value, dict):
        raise ExampleError(f"{where}: expected a JSON object, found {type(value).__name__}")
    fields = (role_field, content_field)
    prompt = _conversation(value, prompt_field, "prompt_field", "user", where, fields)
    chosen = _conversation(value, chosen_field, "chosen_field", "assistant", where, fields)
    rejected = _conversation(value, rejected_field, "rejected_field", "assistant", where, fields)
    for reply, key in ((chosen, chosen_field), (rejected, rejected_field)):
        if any(message["role"] != "assistant" for message in reply):
            raise ExampleError(
                f"{where}: {key!r} must hold assistant messages only (the reply to the prompt)"
            )
    return rendering.reply(prompt, chosen, where), rendering.reply(prompt, rejected, where)


def _conversation(
    value: dict[str, Any], key: str, option: str, role: str, where: str, fields: tuple[str, str]
) -> list[dict[str, str]]:
    """The messages under ``key``: a string is one message of ``role``, a list is checked as messages
    (``fields``: the keys of a message's role and text)."""
    raw = required_field(value, key, where, option)
    if isinstance(raw, str):
        return [{"role": role, "content": raw}]
    if isinstance(raw, list):
        return checked_messages(raw, where, key, *fields)
    raise ExampleError(
        f"{where}: field {key!r} holds {type(raw).__name__}, not a string or a list of messages"
    )
