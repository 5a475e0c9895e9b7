"""`create_app`: the FastAPI application of one served model: the OpenAI routes, ``/health``, ``/metrics``
(Prometheus' text format) and ``/stats`` (the same values as JSON); the engine's thread starts and stops
with the application."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from halyard.serve.config import EngineConfig
from halyard.serve.grammar import Grammars
from halyard.serve.replicas import Replicas
from halyard.serve.server.chat import create_chat_completion
from halyard.serve.server.completions import create_completion
from halyard.serve.server.driver import AsyncEngine
from halyard.serve.server.errors import install_error_handlers
from halyard.serve.server.formatting import now
from halyard.serve.server.generation import ClientGone
from halyard.serve.server.loading import ServedModel
from halyard.serve.server.placement import build_engine
from halyard.serve.server.state import ServerState

METRICS = {
    "waiting": ("gauge", "sequences waiting for admission (the queue)"),
    "running": ("gauge", "sequences holding pages and running"),
    "pages_in_use": ("gauge", "KV pages owned by running sequences"),
    "pages_total": ("gauge", "KV pages in the pool"),
    "requests_in_flight": ("gauge", "requests whose client still waits"),
    "tokens_per_second": ("gauge", "generated tokens per second over the recent steps"),
    "requests_added": ("counter", "requests accepted"),
    "requests_finished": ("counter", "requests finished"),
    "requests_cancelled": ("counter", "requests cancelled (client gone, shutdown)"),
    "tokens_generated": ("counter", "tokens drawn"),
    "tokens_computed": ("counter", "tokens fed through the model (prompts, recomputation, decoding)"),
    "preemptions": ("counter", "sequences preempted for lack of pages"),
    "tokens_proposed": ("counter", "speculative tokens verified (--speculative)"),
    "tokens_accepted": ("counter", "speculative tokens kept"),
    "steps": ("counter", "engine steps"),
    "steps_pipelined": ("counter", "steps dispatched before the step before them was fetched"),
    "compile_seconds": ("counter", "seconds spent compiling step programs"),
    "programs_compiled": ("counter", "step programs compiled (stays after --warmup)"),
    "programs_loaded": ("counter", "step programs read from the compilation cache instead of compiled"),
    "programs_traced": (
        "counter",
        "step programs traced from the model (not lowered from --compilation-cache)",
    ),
}
"""The ``/metrics`` names (``halyard_serve_`` + key), their Prometheus type and meaning."""


def create_app(
    served: ServedModel,
    config: EngineConfig | None = None,
    *,
    api_key: str | None = None,
    tensor: int = 1,
    replicas: int = 1,
) -> FastAPI:
    """The server of ``served`` (the engine is built here; its thread runs while the app does).

    Args:
        served: the model (on one device), its tokenizer and name.
        config: the engine's sizes and policies (each replica's).
        api_key: the bearer token ``/v1`` routes require (None: none).
        tensor: devices the model is split over, tensor parallel (see `tensor_parallel`).
        replicas: copies of the engine, each on ``tensor`` devices of its own (`halyard.serve.Replicas`).

    Raises:
        OptionError: too few devices, or a model that does not divide over ``tensor``.
        ValueError: the config does not fit the model (see `halyard.serve.EngineConfig.context_for`).
    """
    engine = build_engine(served, config, tensor=tensor, replicas=replicas)
    driver = AsyncEngine(engine)
    vocab = served.model.unembedding.axis_size("vocab")
    grammars = Grammars(served.tokenizer.serialized(), vocab, served.eos_token_ids)  # read on a thread
    state = ServerState(
        driver, served.tokenizer, served.name, engine.max_context, now(), api_key, grammars, served.adapters
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # what starting made (model, programs, imports: about 200k objects) is frozen out of the collector's
        # scans, so a full collection walks only what serving makes: at 128 decoding rows the collections had
        # cost about 2 ms a step (benchmarks/README.md, serve_host_step.py)
        gc.collect()
        gc.freeze()
        driver.start()
        try:
            yield
        finally:
            driver.stop()
            if isinstance(engine, Replicas):
                engine.close()
            gc.unfreeze()

    app = FastAPI(title=f"halyard serve: {served.name}", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    install_error_handlers(app)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, error: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: the client left

    def authorized(request: Request) -> None:
        state.check_key(request.headers.get("authorization"))

    v1 = [Depends(authorized)]
    app.add_api_route("/v1/completions", create_completion, methods=["POST"], dependencies=v1)
    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], dependencies=v1)

    @app.get("/v1/models", dependencies=v1)
    async def models() -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [_model_card(state, name) for name in state.model_names]}
        )

    @app.get("/v1/models/{name:path}", dependencies=v1)
    async def model(name: str) -> JSONResponse:
        state.adapter_of(name)  # a 404 for a name not served
        return JSONResponse(_model_card(state, name))

    @app.get("/health")
    async def health() -> JSONResponse:
        if driver.running:
            return JSONResponse({"status": "ok"})
        reason = "the engine failed" if driver.failure is not None else "the engine is not running"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(driver.stats)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prometheus_text(driver.stats), media_type="text/plain; version=0.0.4")

    return app


def prometheus_text(stats: dict[str, float]) -> str:
    """``stats`` in Prometheus' text exposition format (`METRICS`' names)."""
    lines = []
    for key, (kind, meaning) in METRICS.items():
        name = f"halyard_serve_{key}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {name} {meaning}", f"# TYPE {name} {kind}", f"{name} {float(stats.get(key, 0))}"]
    return "\n".join(lines) + "\n"


def _model_card(state: ServerState, name: str) -> dict:
    """``/v1/models``' card of ``name``: an adapter's names its base (``parent``, ``root`` as vLLM's)."""
    card = {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "halyard",
        "max_model_len": state.max_context,
    }
    if name != state.model_name:
        card.update(parent=state.model_name, root=state.model_name)
    return card
