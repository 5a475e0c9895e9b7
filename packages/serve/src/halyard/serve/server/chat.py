"""``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template, continued whole or
streamed, with log-probs and ``n`` choices."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from halyard.serve.outputs import Update
from halyard.serve.server.formatting import chat_logprobs, event_stream, new_id, now, usage
from halyard.serve.server.generation import Generation, unless_disconnected
from halyard.serve.server.protocol import ChatRequest, parse_body
from halyard.serve.server.state import ServerState


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body: ChatRequest = parse_body(await request.body(), ChatRequest)
    state.check_model(body.model)
    text = state.tokenizer.render_chat([message.as_dict() for message in body.messages])
    # The template writes the special tokens (BOS...) itself: the tokenizer adds none.
    prompt = state.tokenizer.encode(text, special_tokens=False)
    params = body.to_sampling(len(prompt), state.max_context)
    renamed = {"prompt": "messages", "max_tokens": body.limit_field}
    generation = Generation(state.driver, [prompt], params, renamed)
    await generation.start()
    chat = _Chat(state, body)
    header = {"id": new_id("chatcmpl"), "created": now(), "model": state.model_name}
    if body.stream:
        chunks = chat.chunks(generation, {**header, "object": "chat.completion.chunk"}, len(prompt))
        return StreamingResponse(event_stream(chunks, generation.cancel), media_type="text/event-stream")
    try:
        (output,) = await unless_disconnected(request, generation.outputs())
    finally:
        generation.cancel()
    choices = [
        {
            "index": sample.index,
            "message": {"role": "assistant", "content": sample.text, "refusal": None},
            "logprobs": chat.logprobs(sample.token_ids, sample.logprobs, sample.top_logprobs),
            "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason,
        }
        for sample in output.samples
    ]
    generated = sum(len(sample.token_ids) for sample in output.samples)
    return JSONResponse(
        {**header, "object": "chat.completion", "choices": choices, "usage": usage(len(prompt), generated)}
    )


class _Chat:
    def __init__(self, state: ServerState, body: ChatRequest):
        self.tokenizer = state.tokenizer
        self.body = body

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
        async for _, update in generation.updates():
            generated += len(update.token_ids)
            if update.text or update.finish_reason or (self.body.logprobs and update.token_ids):
                yield {**header, "choices": [self.delta(update)], **extra}
        if self.body.include_usage:
            yield {**header, "choices": [], "usage": usage(prompt_tokens, generated)}

    def delta(self, update: Update) -> dict[str, Any]:
        return {
            "index": update.index,
            "delta": {"content": update.text} if update.text else {},
            "logprobs": self.logprobs(update.token_ids, update.logprobs, update.top_logprobs),
            "finish_reason": update.finish_reason,
            "stop_reason": update.stop_reason,
        }
