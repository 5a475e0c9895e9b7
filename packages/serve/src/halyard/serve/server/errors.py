"""Errors in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``, with the status that says
whose fault it is (400 for a bad request, never 500: a 500 is a bug of the server)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from halyard.serve.params import ParameterError

logger = logging.getLogger("halyard.serve.server")


class APIError(Exception):
    """A request the server answers with an OpenAI error.

    Args:
        message: one line: what is wrong with which parameter, and what to send instead.
        param: the request field at fault (``messages[1].content``), None when no single one is.
        status: the HTTP status (400 bad request, 401 no key, 404 no such route or model, 503 shutting down).
        code: OpenAI's machine-readable code (``context_length_exceeded``, ``model_not_found``...), if any.
        kind: OpenAI's error ``type``.
    """

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's clients parse."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def parameter_error(error: ParameterError, renamed: Mapping[str, str] | None = None) -> APIError:
    """The 400 of a value the engine refused, naming the field as the request spelt it.

    Args:
        error: what the engine (or `halyard.serve.SamplingParams`) raised.
        renamed: engine parameter names -> the request's (``prompt`` -> ``messages`` for a chat).
    """
    param = (renamed or {}).get(error.parameter, error.parameter)
    message = str(error)
    if param != error.parameter and message.startswith(error.parameter):
        message = param + message[len(error.parameter) :]
    too_long = param in ("prompt", "messages", "max_tokens", "max_completion_tokens") and "context" in message
    return APIError(message, param, code="context_length_exceeded" if too_long else None)


def validation_error(error: ValidationError, fields: list[str]) -> APIError:
    """The first problem pydantic found in a request body, naming its field.

    Args:
        error: what pydantic raised.
        fields: the request's known field names (to suggest one for a misspelt field).
    """
    first = error.errors()[0]
    param = location(first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        close = difflib.get_close_matches(str(first["loc"][-1]), fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; leave it out"
        return APIError(f"{param}: unknown parameter (this server does not implement it){hint}", param)
    return APIError(f"{param}: {first.get('msg', 'invalid value')}", param)


UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})
"""Names pydantic puts in an error's location for the member of a union that failed (not fields)."""


def location(loc: tuple | list) -> str:
    """pydantic's error location as OpenAI names a field: ``messages[0].content``."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not param:
            param = str(part)
        elif str(part).isidentifier() and part not in UNION_TAGS:  # not a union member's tag (list[str])
            param += f".{part}"
    return param or "body"


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app can answer, in OpenAI's format: ours, FastAPI's (no route: 404, wrong method:
    405, a body FastAPI parsed itself: 400) and, for a bug, a 500 whose message says so."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {error.detail}"
        return APIError(message, status=error.status_code, code=str(error.status_code)).response()

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        param = location(errors[0].get("loc", ())[1:]) if errors else "body"
        message = errors[0].get("msg", "invalid request") if errors else "invalid request"
        return APIError(f"{param}: {message}", param).response()

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        message = f"internal error of the server ({type(error).__name__}: {error}); its log has the traceback"
        return APIError(message, status=500, kind="server_error").response()
