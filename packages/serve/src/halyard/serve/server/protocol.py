"""The OpenAI request bodies the server reads (pydantic), checked strictly: an unknown field is refused
(naming the closest known one), a field that would change the result and is not implemented is refused
unless it holds its neutral value, and a harmless one (``user``, ``metadata``...) is accepted.

`CompletionRequest` and `ChatRequest` turn themselves into `halyard.serve.SamplingParams`.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from halyard.serve.grammar import Grammar
from halyard.serve.params import MAX_TOP_LOGPROBS, ParameterError, SamplingParams
from halyard.serve.server.errors import APIError, parameter_error, validation_error
from halyard.serve.server.structured import token_biases

NEUTRAL = object()
"""Marks a refused field's accepted values: see `OpenAIRequest.NOT_IMPLEMENTED`."""


def parse_body(raw: bytes, model: type[OpenAIRequest]) -> Any:
    """A request body (bytes) as ``model``.

    Raises:
        APIError: not JSON, not an object, a field pydantic refuses, or one `OpenAIRequest.NOT_IMPLEMENTED`.
    """
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(
            f"the request body is not valid JSON ({error}); send a JSON object", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise APIError(f"the request body is a JSON {type(data).__name__}; send a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as error:
        raise validation_error(error, list(model.model_fields)) from None
    request.refuse_not_implemented()
    return request


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage of the whole request."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted; no obfuscation padding is sent


class OpenAIRequest(BaseModel):
    """The fields completions and chat share: sampling settings and stop conditions.

    ``top_k``, ``min_p``, ``ignore_eos`` and ``stop_token_ids`` are vLLM's extensions (``top_k`` -1 or 0:
    no limit).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Any = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    # Harmless: accepted, change nothing.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Would change the result, not implemented: refused unless neutral (NOT_IMPLEMENTED).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    # Implemented: halyard.serve.server.structured.
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple[Any, ...]]] = {
        "presence_penalty": (None, 0, 0.0),
        "frequency_penalty": (None, 0, 0.0),
        "repetition_penalty": (None, 1, 1.0),
    }
    """Field -> the values it may hold (``NEUTRAL``: empty). Any other value is refused with a 400."""

    def refuse_not_implemented(self) -> None:
        """Raises `APIError` for the first field that is set and `NOT_IMPLEMENTED` does not allow."""
        for name, allowed in self.NOT_IMPLEMENTED.items():
            value = getattr(self, name)
            if value in [a for a in allowed if a is not NEUTRAL] or (NEUTRAL in allowed and not value):
                continue
            raise APIError(
                f"{name}: not implemented by this server (got {value!r}); leave it out",
                name,
                code="unsupported",
            )
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options: only allowed with stream=true", "stream_options")

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (a string, or a list of strings, each ending a sample)."""
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise APIError("stop: must be a non-empty string or a list of non-empty strings", "stop")
        return tuple(stops)

    def sampling(
        self,
        *,
        max_tokens: int,
        logprobs: bool,
        top_logprobs: int,
        prompt_logprobs: bool,
        grammar: Grammar | None = None,
        renamed: dict[str, str] | None = None,
    ) -> SamplingParams:
        """The engine's settings for this request (``grammar``: what its tokens must follow;
        ``renamed``: engine names -> the request's fields).

        Raises:
            APIError: a value out of range (naming its field).
        """
        top_k = self.top_k if self.top_k is not None else 0
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_k=0 if top_k == -1 else top_k,  # vLLM spells "no limit" -1
                top_p=1.0 if self.top_p is None else self.top_p,
                min_p=0.0 if self.min_p is None else self.min_p,
                seed=self.seed,
                n=self.n,
                stop=self.stop_strings(),
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
                top_logprobs=top_logprobs,
                prompt_logprobs=prompt_logprobs,
                logit_bias=token_biases(self.logit_bias),
                grammar=grammar,
            )
        except ParameterError as error:
            raise parameter_error(error, renamed) from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``. ``prompt``: a string, a list of token ids, or a list of either (one
    request per prompt, ``n`` choices each); ``logprobs``: how many alternatives per token (0-20);
    ``echo``: the prompt (and its log-probs) before the completion; ``max_tokens`` 0 with ``echo`` scores
    the prompt only."""

    prompt: Any
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple[Any, ...]]] = {
        **OpenAIRequest.NOT_IMPLEMENTED,
        "suffix": (None, ""),
    }

    def refuse_not_implemented(self) -> None:
        super().refuse_not_implemented()
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(
                f"best_of: {self.best_of} differs from n={self.n}; choosing the best of several samples is not "
                "implemented: leave best_of out",
                "best_of",
                code="unsupported",
            )

    def prompts(self, encode: Any) -> list[tuple[list[int], str | None]]:
        """Each prompt's token ids and, for a text prompt, its text.

        Args:
            encode: text -> token ids.

        Raises:
            APIError: ``prompt`` is none of the four forms (param ``prompt``).
        """
        prompt = self.prompt
        if isinstance(prompt, str):
            return [(encode(prompt), prompt)]
        if isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt):
            return [(list(prompt), None)]
        if isinstance(prompt, list) and prompt:
            out: list[tuple[list[int], str | None]] = []
            for item in prompt:
                if isinstance(item, str):
                    out.append((encode(item), item))
                elif isinstance(item, list) and all(_is_token(t) for t in item):
                    out.append((list(item), None))
                else:
                    break
            else:
                return out
        raise APIError(
            "prompt: must be a string, a list of token ids, or a non-empty list of strings or token-id lists",
            "prompt",
        )

    def to_sampling(self, grammar: Grammar | None = None) -> tuple[SamplingParams, bool]:
        """The engine's settings (``grammar``: of ``response_format``), and whether the one generated token
        is to be dropped (``max_tokens`` 0 with ``echo``: the prompt is scored, nothing is generated)."""
        max_tokens = 16 if self.max_tokens is None else self.max_tokens
        score_only = max_tokens == 0 and self.echo
        if max_tokens < 1 and not score_only:
            raise APIError(
                f"max_tokens: must be at least 1 (0 only with echo), got {max_tokens}", "max_tokens"
            )
        top = 0 if self.logprobs is None else self.logprobs
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise APIError(f"logprobs: must lie in [0, {MAX_TOP_LOGPROBS}], got {top}", "logprobs")
        params = self.sampling(
            max_tokens=1 if score_only else max_tokens,
            logprobs=self.logprobs is not None,
            top_logprobs=top,
            prompt_logprobs=self.echo and self.logprobs is not None,
            grammar=grammar,
        )
        return params, score_only


class TextPart(BaseModel):
    """A ``{"type": "text", "text": ...}`` part of a message's content."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat. ``content``: a string or a list of text parts (joined by newlines); an
    assistant's ``tool_calls`` and a ``tool`` message's ``tool_call_id`` (the reply to a call) go to the
    template as transformers passes them (a call's ``arguments`` as an object)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template reads it (``developer`` is OpenAI's newer ``system``)."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content or "",
        }
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [_template_call(call) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant's tool call as chat templates read it: ``function.arguments`` an object (OpenAI sends
    JSON text)."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            raise APIError(
                f"messages: a tool call's arguments are not JSON ({arguments[:80]!r})", "messages"
            ) from None
    return {**call, "function": function}


class ChatRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: ``messages`` rendered with the tokenizer's chat template;
    ``logprobs: true`` with ``top_logprobs`` alternatives per token (0-20); ``max_completion_tokens`` (or
    the older ``max_tokens``) default to what the context leaves."""

    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    parallel_tool_calls: bool | None = None  # harmless without tools
    prediction: dict[str, Any] | None = None  # a latency hint: the result is the same without it
    modalities: list[str] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple[Any, ...]]] = {
        **OpenAIRequest.NOT_IMPLEMENTED,
        "functions": (None, NEUTRAL),
        "function_call": (None, "none"),
        "modalities": (None, ["text"]),
        "audio": (None,),
        "reasoning_effort": (None,),
        "web_search_options": (None,),
        "verbosity": (None,),
    }

    def refuse_not_implemented(self) -> None:
        super().refuse_not_implemented()
        if not self.messages:
            raise APIError("messages: is empty; send at least one message", "messages")
        if self.top_logprobs and not self.logprobs:
            raise APIError("top_logprobs: needs logprobs=true", "top_logprobs")

    def to_sampling(
        self, prompt_length: int, max_context: int, grammar: Grammar | None = None
    ) -> SamplingParams:
        """The engine's settings (``grammar``: of ``response_format`` or the tools); without a token limit a
        reply may fill the context."""
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise APIError(
                "max_tokens: differs from max_completion_tokens; send only max_completion_tokens",
                "max_tokens",
            )
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        max_tokens = max(1, max_context - prompt_length) if limit is None else limit
        return self.sampling(
            max_tokens=max_tokens,
            logprobs=bool(self.logprobs),
            top_logprobs=self.top_logprobs or 0,
            prompt_logprobs=False,
            grammar=grammar,
            renamed={"max_tokens": self.limit_field},
        )

    @property
    def limit_field(self) -> str:
        """The field that set the token limit (for errors about it)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
