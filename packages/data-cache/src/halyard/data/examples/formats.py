"""How a JSON record becomes a training example: plain text, a chat, a prompt with its completion, or a
preference pair (a prompt with a chosen and a rejected reply: two examples).

A chat or prompt/completion record is rendered into *segments*: pieces of text, each marked as a training
target (the assistant's turns, the completion) or not (system and user turns, role markers, the prompt).
The processor tokenizes every segment on its own and concatenates the ids, so the loss mask is exactly
the tokens of the target segments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from halyard.data.examples.chat_rendering import ChatRendering
from halyard.data.examples.messages import Segments, checked_messages, required_field
from halyard.data.examples.preference import preference_segments
from halyard.data.sources.records import ExampleError, MissingFieldError

EXAMPLE_KINDS = ("text", "chat", "prompt_completion", "preference")
CHAT_TEMPLATES = ("simple", "tokenizer", "auto")


@dataclass(frozen=True)
class ExampleFormat:
    """What a record holds and how chats are rendered (picklable: it travels with each shard).

    ``kind="text"``: the record's ``text_field`` is a document, every token is a target (pre-training).
    ``kind="chat"``: ``messages_field`` holds a list of ``{role_field: ..., content_field: ...}`` with
    roles ``system``, ``user``, ``assistant``; only the assistant turns are targets, and a chat needs at
    least one. ``kind="prompt_completion"``: ``prompt_field`` then ``completion_field``, concatenated as
    they are (put any separator in the data); only the completion is a target. ``kind="preference"``:
    ``prompt_field``, ``chosen_field`` and ``rejected_field`` make two chats, the prompt as a user message
    and each reply as the assistant's (see `halyard.data.examples.preference`); only the replies are
    targets, and the cache stores the chosen example right before the rejected one.

    The ``simple`` chat template renders each message as ``<marker of its role><content><end_of_turn>``;
    for an assistant turn the content and ``end_of_turn`` are targets (so the model learns to end its
    turn), the marker is not. ``chat_template="tokenizer"`` renders with the Jinja ``chat_template`` of
    the tokenizer's ``tokenizer_config.json`` instead; the target of an assistant turn is then what the
    template adds for that message after the generation prompt (its content and end-of-turn tokens).
    ``chat_template="auto"`` is the tokenizer's template when it has one, else the simple one
    (``build_cache`` decides, and the cache's identity records the choice).

    Attributes:
        kind: one of ``EXAMPLE_KINDS``.
        messages_field: the key of the message list (chat).
        role_field: the key of a message's role (chat).
        content_field: the key of a message's text (chat).
        prompt_field: the key of the prompt (prompt_completion, preference).
        completion_field: the key of the completion (prompt_completion).
        chosen_field: the key of the preferred reply (preference).
        rejected_field: the key of the dispreferred reply (preference).
        chat_template: ``"simple"`` (the markers below), ``"tokenizer"`` (the tokenizer's own template) or
            ``"auto"`` (the tokenizer's when it has one).
        system_marker: text before a system message (simple template).
        user_marker: text before a user message (simple template).
        assistant_marker: text before an assistant message (simple template).
        end_of_turn: text after every message (simple template).
        tokenizer_template: the tokenizer's Jinja template, filled in by ``build_cache`` for
            ``chat_template="tokenizer"`` (leave None).
        template_bos_token: the template's ``bos_token`` variable (filled in likewise).
        template_eos_token: the template's ``eos_token`` variable (filled in likewise).
    """

    kind: str = "text"
    messages_field: str = "messages"
    role_field: str = "role"
    content_field: str = "content"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    chat_template: str = "simple"
    system_marker: str = "<|system|>\n"
    user_marker: str = "<|user|>\n"
    assistant_marker: str = "<|assistant|>\n"
    end_of_turn: str = "\n"
    tokenizer_template: str | None = None
    template_bos_token: str = ""
    template_eos_token: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EXAMPLE_KINDS:
            raise ValueError(f"example format {self.kind!r} is not known; use one of {EXAMPLE_KINDS}")
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"chat_template {self.chat_template!r} is not known; use one of {CHAT_TEMPLATES}"
            )

    @property
    def has_targets(self) -> bool:
        """True for formats that train on part of each example only (chat, prompt_completion, preference)."""
        return self.kind != "text"

    @property
    def markers(self) -> dict[str, str]:
        """The simple template's text before a message, by role."""
        return {"system": self.system_marker, "user": self.user_marker, "assistant": self.assistant_marker}

    @property
    def rendering(self) -> ChatRendering:
        """The chat template chats and preference pairs are rendered with (the tokenizer's or the markers)."""
        template = None
        if self.chat_template == "tokenizer":
            assert self.tokenizer_template is not None, "build_cache fills in the tokenizer's template"
            template = self.tokenizer_template
        return ChatRendering(
            self.markers, self.end_of_turn, template, self.template_bos_token, self.template_eos_token
        )

    def with_tokenizer_template(
        self, template: str | None, bos_token: str | None, eos_token: str | None, tokenizer_source: str
    ) -> ExampleFormat:
        """This format with the tokenizer's chat template filled in (a no-op unless it is needed).

        Args:
            template: the tokenizer's ``chat_template`` (None when it has none).
            bos_token: the tokenizer's BOS text (the template's ``bos_token``), if any.
            eos_token: the tokenizer's EOS text, if any.
            tokenizer_source: where the tokenizer came from (for the message).

        Raises:
            ValueError: ``chat_template="tokenizer"`` but the tokenizer has no chat template.
        """
        if self.kind not in ("chat", "preference") or self.chat_template == "simple":
            return self
        if not template and self.chat_template == "auto":
            return replace(self, chat_template="simple")
        if not template:
            raise ValueError(
                f"chat_template='tokenizer' but the tokenizer {tokenizer_source!r} has no chat_template (it "
                "is read from tokenizer_config.json or chat_template.jinja next to tokenizer.json: pass the "
                "tokenizer folder); use chat_template='simple' otherwise"
            )
        return replace(
            self,
            chat_template="tokenizer",
            tokenizer_template=template,
            template_bos_token=bos_token or "",
            template_eos_token=eos_token or "",
        )

    def describe(self) -> dict[str, Any]:
        """The fields that decide the tokens (stored in the cache identity)."""
        described: dict[str, Any] = {"kind": self.kind}
        if self.kind == "prompt_completion":
            described.update(prompt_field=self.prompt_field, completion_field=self.completion_field)
        elif self.kind in ("chat", "preference"):
            if self.kind == "chat":
                described["messages_field"] = self.messages_field
            else:
                described.update(
                    prompt_field=self.prompt_field,
                    chosen_field=self.chosen_field,
                    rejected_field=self.rejected_field,
                )
            described.update(
                role_field=self.role_field,
                content_field=self.content_field,
                chat_template=self.chat_template,
            )
            if self.chat_template != "tokenizer":
                described.update(
                    system_marker=self.system_marker,
                    user_marker=self.user_marker,
                    assistant_marker=self.assistant_marker,
                    end_of_turn=self.end_of_turn,
                )
            else:
                template = self.tokenizer_template or ""
                described["template_sha256"] = hashlib.sha256(template.encode("utf-8")).hexdigest()
                described.update(bos_token=self.template_bos_token, eos_token=self.template_eos_token)
        return described

    def segments(self, value: Any, where: str) -> Segments:
        """Render one record into target/non-target segments.

        Args:
            value: the parsed JSON object.
            where: ``file:line`` for messages.

        Raises:
            MissingFieldError: a configured field is absent (names it and the keys found).
            ExampleError: anything else wrong with the record (names ``where`` and the fix); a preference
                record, which is two examples (see `pair_segments`).
        """
        if self.kind == "preference":
            raise ExampleError(f"{where}: a preference record is two examples; read it with pair_segments")
        if not isinstance(value, dict):
            raise ExampleError(f"{where}: expected a JSON object, found {type(value).__name__}")
        if self.kind == "prompt_completion":
            prompt = _string_field(value, self.prompt_field, where, "prompt_field")
            completion = _string_field(value, self.completion_field, where, "completion_field")
            if not completion:
                raise ExampleError(
                    f"{where}: the completion {self.completion_field!r} is empty: nothing to train on"
                )
            return ((prompt, False), (completion, True))
        if self.kind != "chat":
            raise ExampleError(f"{where}: example format {self.kind!r} has no segments")
        return self.rendering.chat(self._messages(value, where), where)

    def pair_segments(self, value: Any, where: str) -> tuple[Segments, Segments]:
        """Render one preference record into its chosen and its rejected example (see
        `halyard.data.examples.preference.preference_segments`, which says what it raises)."""
        return preference_segments(
            value,
            where,
            self.rendering,
            prompt_field=self.prompt_field,
            chosen_field=self.chosen_field,
            rejected_field=self.rejected_field,
            role_field=self.role_field,
            content_field=self.content_field,
        )

    def _messages(self, value: dict[str, Any], where: str) -> list[dict[str, str]]:
        if self.messages_field not in value:
            raise MissingFieldError(
                f"{where}: messages field {self.messages_field!r} not found; keys found: {sorted(value)}. "
                "Set messages_field to the key of the message list.",
                "messages_field",
            )
        messages = checked_messages(
            value[self.messages_field], where, self.messages_field, self.role_field, self.content_field
        )
        if not any(message["role"] == "assistant" for message in messages):
            raise ExampleError(f"{where}: the chat has no assistant turn: nothing to train on")
        return messages


def _string_field(value: dict[str, Any], key: str, where: str, option: str) -> str:
    text = required_field(value, key, where, option)
    if not isinstance(text, str):
        raise ExampleError(f"{where}: field {key!r} holds {type(text).__name__}, not a string")
    return text
