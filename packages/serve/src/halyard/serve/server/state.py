"""`ServerState`: what every route of one server reads (the engine's driver, the tokenizer, the model's
name and context, the API key)."""

from __future__ import annotations

import dataclasses
import hmac

from halyard.serve.grammar import Grammars
from halyard.serve.server.driver import AsyncEngine
from halyard.serve.server.errors import APIError
from halyard.serve.server.tokenizer import TextTokenizer


@dataclasses.dataclass
class ServerState:
    """The server's shared state.

    Attributes:
        driver: the engine, driven from asyncio.
        tokenizer: the model's tokenizer.
        model_name: the base model this server serves (what ``model`` says for it).
        max_context: the engine's longest sequence (prompt plus completion), in tokens.
        created: when the server started (seconds since the epoch; ``/v1/models``' ``created``).
        api_key: the bearer token ``/v1`` routes require, or None for none.
        grammars: compiles ``response_format`` and tool grammars against the tokenizer (None: none; such
            requests are refused).
        adapters: the names of the LoRA adapters served beside the base (``model: adapters[i]`` runs
            adapter ``i + 1``).
    """

    driver: AsyncEngine
    tokenizer: TextTokenizer
    model_name: str
    max_context: int
    created: int
    api_key: str | None = None
    grammars: Grammars | None = None
    adapters: tuple[str, ...] = ()

    @property
    def model_names(self) -> tuple[str, ...]:
        """What ``/v1/models`` lists: the base, then the adapters."""
        return (self.model_name, *self.adapters)

    def grammar_compiler(self, param: str) -> Grammars:
        """`grammars`, or a 400 (param ``param``) saying why this server cannot constrain outputs."""
        try:
            if self.grammars is None:
                raise ValueError("none was given")
            self.grammars.tokenizer  # noqa: B018 (read: raises when the library cannot read it)
        except ValueError as error:
            raise APIError(
                f"{param}: this server cannot constrain outputs: the grammar library cannot read the model's "
                f"tokenizer ({error})",
                param,
                code="unsupported",
            ) from None
        return self.grammars

    def adapter_of(self, name: str) -> int:
        """The adapter a request for model ``name`` runs with (0: the base), or a 404 `APIError` (param
        ``model``, code ``model_not_found``, as OpenAI's) for a name not served here."""
        names = self.model_names
        if name not in names:
            served = ", ".join(map(repr, names))
            raise APIError(
                f"model: {name!r} is not served here; this server serves {served} (GET /v1/models)",
                "model",
                status=404,
                code="model_not_found",
            )
        return names.index(name)

    def check_key(self, authorization: str | None) -> None:
        """Raises a 401 `APIError` unless ``authorization`` is ``Bearer <the key>`` (or no key is set)."""
        if self.api_key is None:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            said = "no Authorization header" if authorization is None else "a wrong API key"
            raise APIError(
                f"this server needs an API key: send 'Authorization: Bearer <key>' (the request had {said})",
                status=401,
                code="invalid_api_key",
            )
