"""``response_format`` and ``logit_bias``: a request's grammar (`halyard.serve.grammar`) and its token biases,
read from the OpenAI fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from halyard.serve.grammar import Grammar, GrammarError, Grammars
from halyard.serve.server.errors import APIError

RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def response_grammar(
    response_format: dict[str, Any] | None, compiler: Callable[[], Grammars]
) -> Grammar | None:
    """The grammar of ``response_format``: None for ``text`` (or none given), any JSON object for
    ``json_object``, JSON valid under ``json_schema.schema`` for ``json_schema`` (``strict`` or not: the
    output always validates). ``compiler`` gives the grammar compiler (only when a grammar is needed).

    Raises:
        APIError: an unknown type, a ``json_schema`` without a schema, or a schema the grammar library
            cannot compile (its reason in the message; param ``response_format``).
    """
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise APIError(
            f"response_format: type {kind!r} is not one of {', '.join(RESPONSE_FORMATS)}", "response_format"
        )
    try:
        if kind == "json_object":
            return compiler().json_schema(None, "response_format")
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError(
                    "response_format: json_schema needs {'name': ..., 'schema': {...}}; the schema is missing",
                    "response_format",
                )
            return compiler().json_schema(schema, "response_format")
    except GrammarError as error:
        raise APIError(str(error), error.parameter) from None
    return None


def token_biases(logit_bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (token id as a string -> bias) as ``(token id, bias)`` pairs, by token id.

    Raises:
        APIError: a key that is not a token id (param ``logit_bias``; the range is `SamplingParams`').
    """
    pairs = []
    for key, bias in (logit_bias or {}).items():
        if not key.strip().isdigit():
            raise APIError(
                f"logit_bias: key {key!r} is not a token id (a non-negative integer)", "logit_bias"
            )
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))
