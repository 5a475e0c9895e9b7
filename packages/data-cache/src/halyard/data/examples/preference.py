"""Preference pairs: a prompt with a chosen and a rejected reply, rendered as two chats (DPO data).

A record ``{"prompt": ..., "chosen": ..., "rejected": ...}`` becomes two examples, ``prompt + chosen`` and
``prompt + rejected``, whose targets are the reply only. A string prompt is one user message and a string
reply one assistant message; TRL's conversational form works too (the prompt a list of messages, each reply
a list of assistant messages). Both examples are rendered with the format's chat template (the simple
markers, or the tokenizer's own template), so the prompt's tokens are the same in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from halyard.data.examples.hf_template import render_reply_with_template
from halyard.data.examples.messages import Segments, checked_messages, marker_segments, required_field
from halyard.data.sources.records import ExampleError

if TYPE_CHECKING:
    from halyard.data.examples.formats import ExampleFormat


def preference_segments(example: ExampleFormat, value: Any, where: str) -> tuple[Segments, Segments]:
    """The chosen and the rejected example of one preference record, as target/non-target segments.

    Args:
        example: the format (``kind="preference"``): field names and chat template.
        value: the parsed JSON object.
        where: ``file:line`` for messages.

    Raises:
        MissingFieldError: the prompt, chosen or rejected field is absent (names it and the keys found).
        ExampleError: a field of the wrong type, a reply message that is not the assistant's, or a
            tokenizer template that cannot locate the reply.
    """
    if not isinstance(value, dict):
        raise ExampleError(f"{where}: expected a JSON object, found {type(value).__name__}")
    prompt = _conversation(example, value, example.prompt_field, "prompt_field", "user", where)
    chosen = _conversation(example, value, example.chosen_field, "chosen_field", "assistant", where)
    rejected = _conversation(example, value, example.rejected_field, "rejected_field", "assistant", where)
    for reply, key in ((chosen, example.chosen_field), (rejected, example.rejected_field)):
        if any(message["role"] != "assistant" for message in reply):
            raise ExampleError(
                f"{where}: {key!r} must hold assistant messages only (the reply to the prompt)"
            )
    return _render(example, prompt, chosen, where), _render(example, prompt, rejected, where)


def _conversation(
    example: ExampleFormat, value: dict[str, Any], key: str, option: str, role: str, where: str
) -> list[dict[str, str]]:
    """The messages under ``key``: a string is one message of ``role``, a list is checked as messages."""
    raw = required_field(value, key, where, option)
    if isinstance(raw, str):
        return [{"role": role, "content": raw}]
    if isinstance(raw, list):
        return checked_messages(raw, where, key, example.role_field, example.content_field)
    raise ExampleError(
        f"{where}: field {key!r} holds {type(raw).__name__}, not a string or a list of messages"
    )


def _render(
    example: ExampleFormat, prompt: list[dict[str, str]], reply: list[dict[str, str]], where: str
) -> Segments:
    if example.chat_template == "tokenizer":
        assert example.tokenizer_template is not None, "build_cache fills in the tokenizer's template"
        return render_reply_with_template(
            example.tokenizer_template,
            prompt,
            reply,
            where,
            example.template_bos_token,
            example.template_eos_token,
        )
    targets = [False] * len(prompt) + [True] * len(reply)
    return marker_segments(prompt + reply, targets, example.markers, example.end_of_turn)
