"""`ChatRendering`: how a conversation becomes target/non-target segments, with the simple markers or with a
tokenizer's own chat template. Chats and preference pairs are both rendered through it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from halyard.data.examples.hf_template import render_reply_with_template, render_with_template
from halyard.data.examples.messages import Segments, marker_segments


@dataclass(frozen=True)
class ChatRendering:
    """A chat template: the simple markers, or the tokenizer's Jinja template when ``template`` is set.

    Attributes:
        markers: the simple template's text before a message, by role.
        end_of_turn: the simple template's text after every message.
        template: the tokenizer's ``chat_template`` (None: render with the markers).
        bos_token: the template's ``bos_token`` variable.
        eos_token: the template's ``eos_token`` variable.
    """

    markers: Mapping[str, str]
    end_of_turn: str
    template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    def chat(self, messages: list[dict[str, str]], where: str) -> Segments:
        """A chat whose assistant turns are the targets.

        Args:
            messages: checked ``{"role", "content"}`` dicts.
            where: ``file:line`` for messages.

        Raises:
            ExampleError: the tokenizer's template cannot locate the assistant's text.
        """
        if self.template is not None:
            return render_with_template(self.template, messages, where, self.bos_token, self.eos_token)
        targets = [message["role"] == "assistant" for message in messages]
        return marker_segments(messages, targets, self.markers, self.end_of_turn)

    def reply(self, prompt: list[dict[str, str]], reply: list[dict[str, str]], where: str) -> Segments:
        """``prompt + reply`` where only the reply is a target (one side of a preference pair).

        Args:
            prompt: the checked conversation before the reply.
            reply: the assistant message(s) answering it.
            where: ``file:line`` for messages.

        Raises:
            ExampleError: the tokenizer's template cannot locate the reply.
        """
        if self.template is not None:
            return render_reply_with_template(
                self.template, prompt, reply, where, self.bos_token, self.eos_token
            )
        targets = [False] * len(prompt) + [True] * len(reply)
        return marker_segments(prompt + reply, targets, self.markers, self.end_of_turn)
