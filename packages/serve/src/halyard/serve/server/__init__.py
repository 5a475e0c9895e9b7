"""halyard.serve.server: the OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn; no model
code: routes translate OpenAI requests to engine requests and back).

served = load_hf_folder("path/to/hf-folder")
app = create_app(served, EngineConfig(num_pages=256))     # or, from a shell: halyard-serve --hf FOLDER
"""

from halyard.serve.server.app import create_app
from halyard.serve.server.cli import add_server_arguments, chat_template_of, engine_config_of, run_server
from halyard.serve.server.driver import AsyncEngine, EngineUnavailable
from halyard.serve.server.errors import APIError
from halyard.serve.server.loading import ServedModel, load_hf_folder, served_model
from halyard.serve.server.placement import OptionError, build_engine, tensor_parallel
from halyard.serve.server.tokenizer import TextTokenizer

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
