"""``POST /v1/completions``: prompts (text or token ids) continued, whole or streamed, with log-probs,
``echo`` and ``n`` choices per prompt."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from halyard.serve.outputs import RequestOutput, TopLogprobs, Update
from halyard.serve.server.formatting import completion_logprobs, event_stream, new_id, now, usage
from halyard.serve.server.generation import Generation, unless_disconnected
from halyard.serve.server.protocol import CompletionRequest, parse_body
from halyard.serve.server.state import ServerState
from halyard.serve.server.structured import response_grammar


@dataclasses.dataclass
class _Prompt:
    """One prompt as the choices show it: its ids, the text ``echo`` repeats, its log-probs once known."""

    token_ids: list[int]
    text: str
    logprobs: list[float | None] | None = None
    top: list[TopLogprobs | None] | None = None


async def create_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body: CompletionRequest = parse_body(await request.body(), CompletionRequest)
    adapter = state.adapter_of(body.model)
    encoded = body.prompts(lambda text: state.tokenizer.encode(text, special_tokens=True))
    grammar = (
        None
        if body.response_format is None
        else response_grammar(body.response_format, lambda: state.grammar_compiler("response_format"))
    )
    params, score_only = body.to_sampling(grammar)
    params = dataclasses.replace(params, adapter=adapter)
    prompts = [
        _Prompt(ids, text if text is not None else state.tokenizer.decode(ids)) for ids, text in encoded
    ]
    generation = Generation(state.driver, [p.token_ids for p in prompts], params)
    await generation.start()
    header = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": body.model}
    completion = _Completion(state, body, prompts, score_only)
    if body.stream:
        chunks = completion.chunks(generation, header)
        return StreamingResponse(event_stream(chunks, generation.cancel), media_type="text/event-stream")
    try:
        outputs = await unless_disconnected(request, generation.outputs())
    finally:
        generation.cancel()
    return JSONResponse(completion.whole(outputs, header))


class _Completion:
    """Turns one request's engine outputs into choices (choice ``i * n + j``: prompt i, sample j)."""

    def __init__(self, state: ServerState, body: CompletionRequest, prompts: list[_Prompt], score_only: bool):
        self.tokenizer = state.tokenizer
        self.body = body
        self.prompts = prompts
        self.score_only = score_only
        self.n = body.n

    def whole(self, outputs: list[RequestOutput], header: dict[str, Any]) -> dict[str, Any]:
        choices, generated = [], 0
        for index, output in enumerate(outputs):
            prompt = self.prompts[index]
            prompt.logprobs, prompt.top = output.prompt_logprobs, output.prompt_top_logprobs
            for sample in output.samples:
                update = Update(
                    output.request_id,
                    sample.index,
                    sample.token_ids,
                    sample.text,
                    sample.logprobs,
                    sample.sampled_logprobs,
                    sample.top_logprobs,
                    sample.finish_reason,
                    sample.stop_reason,
                )
                choice, tokens = self.choice(index, update, first=True, offset=0)
                choices.append(choice)
                generated += tokens
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return {**header, "choices": choices, "usage": usage(prompt_tokens, generated)}

    async def chunks(self, generation: Generation, header: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        extra = {"usage": None} if self.body.include_usage else {}
        started: set[int] = set()
        offsets: dict[int, int] = {}
        generated = 0
        async for index, update in generation.updates():
            prompt = self.prompts[index]
            if update.prompt_logprobs is not None:
                prompt.logprobs, prompt.top = update.prompt_logprobs, update.prompt_top_logprobs
            number = index * self.n + update.index
            first = number not in started
            started.add(number)
            choice, tokens = self.choice(index, update, first=first, offset=offsets.get(number, 0))
            generated += tokens
            offsets[number] = offsets.get(number, 0) + len(choice["text"])
            if choice["text"] or choice["logprobs"] or choice["finish_reason"] or first:
                yield {**header, "choices": [choice], **extra}
        if self.body.include_usage:
            prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
            yield {**header, "choices": [], "usage": usage(prompt_tokens, generated)}

    def choice(self, index: int, update: Update, *, first: bool, offset: int) -> tuple[dict[str, Any], int]:
        """One choice (whole, or a stream's chunk of it) and how many generated tokens it shows.

        Args:
            index: the prompt's index.
            update: the sample's tokens and text (all of them, or those of one step).
            first: the choice's first piece (``echo`` puts the prompt before it).
            offset: characters of the choice's text sent before this piece.
        """
        prompt = self.prompts[index]
        text, token_ids = update.text, list(update.token_ids)
        logprobs: list[float | None] = list(update.logprobs)
        top: list[TopLogprobs | None] = list(update.top_logprobs)
        if self.score_only:  # the one token drawn to read the prompt is not part of the answer
            text, token_ids, logprobs, top = "", [], [], []
        generated = len(token_ids)
        if first and self.body.echo:
            text = prompt.text + text
            token_ids = prompt.token_ids + token_ids
            prompt_logprobs = prompt.logprobs or [None] * len(prompt.token_ids)
            logprobs = list(prompt_logprobs) + logprobs
            top = list(prompt.top or [None] * len(prompt.token_ids)) + top
        choice: dict[str, Any] = {
            "index": index * self.n + update.index,
            "text": text,
            "logprobs": None,
            "finish_reason": "length" if self.score_only and update.finish_reason else update.finish_reason,
            "stop_reason": update.stop_reason,
        }
        if self.body.logprobs is not None and token_ids:
            choice["logprobs"] = completion_logprobs(self.tokenizer, token_ids, logprobs, top, offset)
        return choice, generated
