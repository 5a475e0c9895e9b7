"""halyard.serve.server: the OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn; no model
code: routes translate OpenAI requests to engine requests and back).

served = load_hf_folder("path/to/hf-folder")
app = create_app(served, EngineConfig(num_pages=256))     # or, from a shell: halyard-serve --hf FOLDER

A name is imported on first use: a command parses its options (`add_server_arguments`) and starts JAX's
backend before FastAPI and the checkpoint readers are imported.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from halyard.serve.server.app import create_app
    from halyard.serve.server.cli import run_server
    from halyard.serve.server.driver import AsyncEngine, EngineUnavailable
    from halyard.serve.server.errors import APIError
    from halyard.serve.server.loading import ServedModel, load_hf_folder, served_model
    from halyard.serve.server.options import (
        OptionError,
        add_server_arguments,
        chat_template_of,
        engine_config_of,
    )
    from halyard.serve.server.placement import build_engine, tensor_parallel
    from halyard.serve.server.tokenizer import TextTokenizer

_WHERE = {
    "APIError": "halyard.serve.server.errors",
    "AsyncEngine": "halyard.serve.server.driver",
    "EngineUnavailable": "halyard.serve.server.driver",
    "OptionError": "halyard.serve.server.options",
    "ServedModel": "halyard.serve.server.loading",
    "TextTokenizer": "halyard.serve.server.tokenizer",
    "add_server_arguments": "halyard.serve.server.options",
    "build_engine": "halyard.serve.server.placement",
    "chat_template_of": "halyard.serve.server.options",
    "create_app": "halyard.serve.server.app",
    "engine_config_of": "halyard.serve.server.options",
    "load_hf_folder": "halyard.serve.server.loading",
    "run_server": "halyard.serve.server.cli",
    "served_model": "halyard.serve.server.loading",
    "tensor_parallel": "halyard.serve.server.placement",
}

__all__ = [
    "APIError",
    "AsyncEngine",
    "EngineUnavailable",
    "OptionError",
    "ServedModel",
    "TextTokenizer",
    "add_server_arguments",
    "build_engine",
    "chat_template_of",
    "create_app",
    "engine_config_of",
    "load_hf_folder",
    "run_server",
    "served_model",
    "tensor_parallel",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'halyard.serve.server' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
