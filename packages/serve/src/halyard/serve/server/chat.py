"""``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template, continued whole or
streamed, with log-probs and ``n`` choices."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from halyard.serve.grammar import Grammar
from halyard.serve.outputs import Update
from halyard.serve.server.errors import APIError
from halyard.serve.server.formatting import chat_logprobs, event_stream, new_id, now, usage
from halyard.serve.server.generation import Generation, unless_disconnected
from halyard.serve.server.protocol import ChatRequest, parse_body
from halyard.serve.server.state import ServerState
from halyard.serve.server.structured import response_grammar
from halyard.serve.server.tools import ToolCall, ToolPlan, tool_plan


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body: ChatRequest = parse_body(await request.body(), ChatRequest)
    adapter = state.adapter_of(body.model)
    grammar, plan = _grammar_and_tools(state, body)
    messages = [message.as_dict() for message in body.messages]
    text = state.tokenizer.render_chat(messages, None if plan is None else plan.definitions)
    # The template writes the special tokens (BOS...) itself: the tokenizer adds none.
    prompt = state.tokenizer.encode(text, special_tokens=False)
    params = dataclasses.replace(body.to_sampling(len(prompt), state.max_context, grammar), adapter=adapter)
    renamed = {"prompt": "messages", "max_tokens": body.limit_field}
    generation = Generation(state.driver, [prompt], params, renamed)
    await generation.start()
    chat = _Chat(state, body, plan)
    header = {"id": new_id("chatcmpl"), "created": now(), "model": body.model}
    if body.stream:
        chunks = chat.chunks(generation, {**header, "object": "chat.completion.chunk"}, len(prompt))
        return StreamingResponse(event_stream(chunks, generation.cancel), media_type="text/event-stream")
    try:
        (output,) = await unless_disconnected(request, generation.outputs())
    finally:
        generation.cancel()
    choices = []
    for sample in output.samples:
        content, calls = chat.calls(sample.text)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = [call.as_dict() for call in calls]
        choice = {
            "index": sample.index,
            "message": message,
            "logprobs": chat.logprobs(sample.token_ids, sample.logprobs, sample.top_logprobs),
            "finish_reason": chat.finish_reason(sample.finish_reason, calls),
            "stop_reason": sample.stop_reason,
        }
        choices.append(choice)
    generated = sum(len(sample.token_ids) for sample in output.samples)
    return JSONResponse(
        {**header, "object": "chat.completion", "choices": choices, "usage": usage(len(prompt), generated)}
    )


def _grammar_and_tools(state: ServerState, body: ChatRequest) -> tuple[Grammar | None, ToolPlan | None]:
    """The grammar of ``response_format`` or of the tools' ``tool_choice`` (at most one), and the tools' plan."""
    grammar = None
    if body.response_format is not None:
        grammar = response_grammar(body.response_format, lambda: state.grammar_compiler("response_format"))
    plan = None
    if body.tools or body.tool_choice is not None:
        plan = tool_plan(
            body.tools, body.tool_choice, body.parallel_tool_calls, lambda: state.grammar_compiler("tools")
        )
    if plan is not None and plan.grammar is not None:
        if grammar is not None:
            raise APIError(
                "response_format: a JSON response_format and tool_choice 'required' or a named function both "
                "constrain the answer; send one of them",
                "response_format",
            )
        grammar = plan.grammar
    return grammar, plan


class _Chat:
    def __init__(self, state: ServerState, body: ChatRequest, plan: ToolPlan | None):
        self.tokenizer = state.tokenizer
        self.body = body
        self.plan = plan

    def calls(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A finished answer's content and tool calls."""
        return (text, []) if self.plan is None else self.plan.calls(text)

    def finish_reason(self, reason: str | None, calls: list[ToolCall]) -> str | None:
        """``tool_calls`` for an answer that ended with calls (a named function's: ``stop``, as OpenAI's)."""
        if reason == "stop" and calls and self.plan is not None and self.plan.choice in ("auto", "required"):
            return "tool_calls"
        return reason

    def logprobs(self, token_ids: list[int], logprobs: list[float], top: Any) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return {"content": chat_logprobs(self.tokenizer, token_ids, logprobs, top), "refusal": None}

    async def chunks(
        self, generation: Generation, header: dict[str, Any], prompt_tokens: int
    ) -> AsyncIterator[dict[str, Any]]:
        extra = {"usage": None} if self.body.include_usage else {}
        generated = 0
        for index in range(self.body.n):  # OpenAI's first chunk of a choice names the role
            delta = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            yield {**header, "choices": [choice], **extra}
        held: dict[int, str] = {}  # with tools, each choice's text until it ends (it may be calls)
        async for _, update in generation.updates():
            generated += len(update.token_ids)
            chunk = self.delta(update, held)
            if chunk["delta"] or update.finish_reason or (self.body.logprobs and update.token_ids):
                yield {**header, "choices": [chunk], **extra}
        if self.body.include_usage:
            yield {**header, "choices": [], "usage": usage(prompt_tokens, generated)}

    def delta(self, update: Update, held: dict[int, str]) -> dict[str, Any]:
        """A stream's chunk of one choice. With tools, the text is held in ``held`` until the choice ends,
        then sent as content or as tool-call deltas."""
        delta: dict[str, Any] = {"content": update.text} if update.text else {}
        finish_reason = update.finish_reason
        if self.plan is not None:
            held[update.index] = held.get(update.index, "") + update.text
            delta = {}
            if finish_reason is not None:
                content, calls = self.plan.calls(held.pop(update.index))
                delta = {"content": content} if content else {}
                if calls:
                    delta["tool_calls"] = [call.as_dict(index) for index, call in enumerate(calls)]
                finish_reason = self.finish_reason(finish_reason, calls)
        return {
            "index": update.index,
            "delta": delta,
            "logprobs": self.logprobs(update.token_ids, update.logprobs, update.top_logprobs),
            "finish_reason": finish_reason,
            "stop_reason": update.stop_reason,
        }
