"""Message lists shared by chats and preference pairs: checking them and rendering them with role markers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from halyard.data.sources.records import ExampleError, MissingFieldError

ROLES = ("system", "user", "assistant")

# ``(text, is_target)`` pieces of one example, in order.
Segments = tuple[tuple[str, bool], ...]


def checked_messages(
    raw: Any, where: str, key: str, role_field: str, content_field: str
) -> list[dict[str, str]]:
    """``raw`` as ``{"role", "content"}`` dicts, each message checked.

    Args:
        raw: the record's value under ``key`` (a non-empty list of message objects).
        where: ``file:line`` for messages.
        key: the record key holding the list (for messages).
        role_field: the key of a message's role.
        content_field: the key of a message's text.

    Raises:
        MissingFieldError: a message without ``role_field`` or ``content_field``.
        ExampleError: not a non-empty list, a message that is not an object, an unknown role, or a text that
            is not a string.
    """
    if not isinstance(raw, list) or not raw:
        raise ExampleError(f"{where}: {key!r} must be a non-empty list of messages")
    messages = []
    for index, message in enumerate(raw):
        here = f"{where}: message {index}"
        if not isinstance(message, dict):
            raise ExampleError(f"{here} is a {type(message).__name__}, not an object")
        for field, option in ((role_field, "role_field"), (content_field, "content_field")):
            if field not in message:
                raise MissingFieldError(
                    f"{here} has no {field!r}; keys found: {sorted(message)}. Set {option} to the right key.",
                    option,
                )
        role, content = message[role_field], message[content_field]
        if role not in ROLES:
            raise ExampleError(f"{here} has the unknown role {role!r}; roles are {ROLES}")
        if not isinstance(content, str):
            raise ExampleError(f"{here}: {content_field!r} holds {type(content).__name__}, not a string")
        messages.append({"role": role, "content": content})
    return messages


def required_field(value: Mapping[str, Any], key: str, where: str, option: str) -> Any:
    """``value[key]`` of a record.

    Raises:
        MissingFieldError: ``key`` is absent (names it, the keys found and ``option``, the setting naming it).
    """
    if key not in value:
        raise MissingFieldError(
            f"{where}: field {key!r} not found; keys found: {sorted(value)}. Set {option} to the right key.",
            option,
        )
    return value[key]


def marker_segments(
    messages: Sequence[Mapping[str, str]],
    targets: Sequence[bool],
    markers: Mapping[str, str],
    end_of_turn: str,
) -> Segments:
    """The simple template: each message is ``<marker of its role><content><end_of_turn>``.

    Args:
        messages: checked ``{"role", "content"}`` dicts.
        targets: per message, whether its content and end of turn are training targets (a marker never is).
        markers: the text before a message, by role.
        end_of_turn: the text after every message.
    """
    pieces: list[tuple[str, bool]] = []
    for message, target in zip(messages, targets, strict=True):
        pieces.append((markers[message["role"]], False))
        pieces.append((message["content"] + end_of_turn, target))
    return tuple(pieces)
