"""Render a chat with a tokenizer's own Jinja ``chat_template`` and find the assistant's part of the text.

The template is run the way ``transformers`` runs it (a sandboxed Jinja environment with ``trim_blocks``,
``lstrip_blocks``, ``raise_exception`` and a ``tojson`` filter; variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``). Templates render the whole conversation, so the
assistant turns are found by rendering prefixes: for the assistant message ``i``, the text of
``messages[:i]`` with the generation prompt is what comes before the turn, and the text of
``messages[:i + 1]`` ends right after it. What lies between is the turn's target text. A preference
pair's reply is found the same way: what ``prompt + reply`` adds to the prompt's generation prompt.
"""

from __future__ import annotations

import json
from typing import Any

from halyard.data.sources.records import ExampleError

# One compiled template per process and template text.
_COMPILED: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    compiled = _COMPILED.get(template)
    if compiled is None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ExampleError(message)

        def tojson(value: Any, indent: int | None = None) -> str:
            return json.dumps(value, indent=indent, ensure_ascii=False)

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        compiled = _COMPILED[template] = environment.from_string(template)
    return compiled


def render_with_template(
    template: str, messages: list[dict[str, str]], where: str, bos_token: str = "", eos_token: str = ""
) -> tuple[tuple[str, bool], ...]:
    """Render ``messages`` with a Jinja chat template into ``(text, is_target)`` segments.

    Args:
        template: the ``chat_template`` text.
        messages: ``{"role", "content"}`` dicts (already validated).
        where: ``file:line`` for messages.
        bos_token: the value of the template's ``bos_token`` variable.
        eos_token: the value of the template's ``eos_token`` variable.

    Raises:
        ExampleError: the template raised, or it renders a conversation so that a shorter conversation
            is not a prefix of a longer one (the assistant's text cannot be located); use the simple
            template then.
    """
    compiled = _compiled(template)

    def render(prefix: list[dict[str, str]], generation_prompt: bool) -> str:
        return _render(compiled, prefix, generation_prompt, where, bos_token, eos_token)

    full = render(messages, False)
    segments: list[tuple[str, bool]] = []
    done = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], True)
        through = render(messages[: index + 1], False)
        if len(before) < done or not (full.startswith(through) and through.startswith(before)):
            raise ExampleError(
                f"{where}: the tokenizer's chat template does not render message {index} as an extension of "
                "the messages before it, so the assistant's tokens cannot be located; use "
                "chat_template='simple'"
            )
        segments.append((full[done : len(before)], False))
        segments.append((full[len(before) : len(through)], True))
        done = len(through)
    segments.append((full[done:], False))
    return tuple((text, target) for text, target in segments if text)


def render_prompt_with_template(
    template: str,
    prompt: list[dict[str, Any]],
    where: str,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render ``prompt`` with a Jinja chat template and its generation prompt: the text a model continues
    to answer (a reinforcement-learning prompt, a chat request).

    Args:
        template: the ``chat_template`` text.
        prompt: the conversation so far (checked ``{"role", "content"}`` dicts).
        where: ``file:line`` for messages.
        bos_token, eos_token: the values of the template's ``bos_token`` and ``eos_token`` variables.
        tools: the template's ``tools`` variable (OpenAI's function definitions, as transformers'
            ``apply_chat_template(tools=...)`` passes them); None: none.

    Raises:
        ExampleError: the template raised (named with ``where``).
    """
    return _render(_compiled(template), prompt, True, where, bos_token, eos_token, tools)


def render_reply_with_template(
    template: str,
    prompt: list[dict[str, str]],
    reply: list[dict[str, str]],
    where: str,
    bos_token: str = "",
    eos_token: str = "",
) -> tuple[tuple[str, bool], ...]:
    """Render ``prompt + reply`` with a Jinja chat template; only the reply's text is a target.

    The prompt is rendered with the generation prompt (what a model sees before it answers); the reply is
    what the whole conversation adds after it (as TRL's preference tokenization does).

    Args:
        template: the ``chat_template`` text.
        prompt: the conversation before the reply (checked ``{"role", "content"}`` dicts).
        reply: the assistant message(s) answering it.
        where: ``file:line`` for messages.
        bos_token: the value of the template's ``bos_token`` variable.
        eos_token: the value of the template's ``eos_token`` variable.

    Raises:
        ExampleError: the template raised, or the whole conversation does not start with the prompt's
            rendering (the reply cannot be located); use the simple template then.
    """
    compiled = _compiled(template)
    before = _render(compiled, prompt, True, where, bos_token, eos_token)
    full = _render(compiled, prompt + reply, False, where, bos_token, eos_token)
    if not full.startswith(before):
        raise ExampleError(
            f"{where}: the tokenizer's chat template does not render the reply as an extension of the prompt "
            "with its generation prompt, so the reply's tokens cannot be located; use chat_template='simple'"
        )
    return tuple((text, target) for text, target in ((before, False), (full[len(before) :], True)) if text)


def _render(
    compiled: Any,
    messages: list[dict[str, str]],
    generation_prompt: bool,
    where: str,
    bos_token: str,
    eos_token: str,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    try:
        return str(
            compiled.render(
                messages=messages,
                add_generation_prompt=generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                tools=tools,
            )
        )
    except ExampleError as error:
        raise ExampleError(f"{where}: the tokenizer's chat template refused the chat: {error}") from None
