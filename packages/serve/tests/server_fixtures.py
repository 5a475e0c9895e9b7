"""A tiny Hugging Face folder (a Llama of a few thousand parameters, a word-level tokenizer with a Llama-3
style chat template) and a `halyard-serve` subprocess on a free loopback port or a unix socket, for the server's
tests; and the server the answer and operation tests share (session fixtures, registered in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jax
import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from halyard.export import export_hf, import_hf
from halyard.models import init_model, model_config

WORDS = [
    "<unk>", "user", "assistant", "system", "the", "a", "of", "to", "and", "in", "is", "it", "you", "that",
    "he", "was", "for", "on", "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from",
    "or", "had", "by", "hot", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each"
]  # fmt: skip
SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
EOT = len(WORDS) + 1
VOCAB = len(WORDS) + len(SPECIALS)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|> "
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)
MODEL_NAME = "tiny"
ENGINE_OPTIONS = [
    "--page-size", "8", "--num-pages", "40", "--max-context", "96", "--max-running", "8",
    "--chunk-size", "16", "--max-prefill-rows", "2", "--deterministic", "--deterministic-rows", "4",
]  # fmt: skip
"""Small programs, few shapes (deterministic mode compiles one row count per program kind; with 8 running
sequences a step runs two 4-row decoding programs), the same in every module (they share the compilation
cache), and fewer pages than 8 running sequences can fill (under load, sequences are preempted and
recomputed)."""


def tiny_hf_folder(folder: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """A random tiny Llama exported by halyard.export (weights stored in ``dtype``) with a word-level
    tokenizer and a chat template."""
    tokenizer_folder = folder.parent / f"{folder.name}-tokenizer"
    tokenizer_folder.mkdir(parents=True)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(tokenizer_folder / "tokenizer.json"))
    settings = {
        "bos_token": SPECIALS[0],
        "eos_token": "<|eot_id|>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (tokenizer_folder / "tokenizer_config.json").write_text(json.dumps(settings))
    config = model_config(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=128,
        initializer_range=0.3,
    )
    export_hf(init_model(config, jax.random.key(seed)), folder, tokenizer=tokenizer_folder, dtype=dtype)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_environment() -> dict[str, str]:
    """One CPU device, the tests' compile flags and compilation cache."""
    flags = os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", "")
    return dict(
        os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {flags}", JAX_PLATFORMS="cpu"
    )


class ServerProcess:
    """A server subprocess on a loopback ``port`` or a unix socket ``uds``: its URL, HTTP clients that reach
    it, its log file, and a clean way to stop it."""

    def __init__(self, command: list[str], log: Path, port: int | None = None, uds: Path | None = None):
        self.port, self.uds = port, uds
        self.url = "http://halyard" if uds is not None else f"http://127.0.0.1:{port}"
        self.log = log
        self._log_file = log.open("w")
        self.process = subprocess.Popen(
            command, stdout=self._log_file, stderr=subprocess.STDOUT, env=server_environment()
        )

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError), self.http() as client:
                if client.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the server did not answer /health in {timeout} s:\n{self.output()}")

    def http(self) -> httpx.Client:
        """A client that reaches the server (through its unix socket when it has one)."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.uds)) if self.uds else None)

    def async_http(self) -> httpx.AsyncClient:
        """An asyncio client that reaches the server, for ``openai.AsyncOpenAI(http_client=...)`` (the
        ``openai`` client's own connection limits: many streams at once)."""
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        transport = httpx.AsyncHTTPTransport(uds=str(self.uds) if self.uds else None, limits=limits)
        return httpx.AsyncClient(transport=transport)

    def stats(self) -> dict[str, float]:
        with self.http() as client:
            return client.get(self.url + "/stats", timeout=10).json()

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return int(self.process.returncode)


def start_server(folder: Path, log: Path, *extra: str, uds: Path | None = None) -> ServerProcess:
    """``halyard-serve --hf folder`` with the tests' engine options, once it answers /health; on a free
    loopback port, or on the unix socket ``uds`` (``--uds``)."""
    port = None if uds is not None else free_port()
    where = ["--uds", str(uds)] if uds is not None else ["--port", str(port)]
    command = [
        sys.executable, "-m", "halyard.serve.server.cli", "--hf", str(folder), *where,
        "--model-name", MODEL_NAME, *ENGINE_OPTIONS, *extra,
    ]  # fmt: skip
    server = ServerProcess(command, log, port, uds)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


# -- the shared server of test_server_answers.py and test_server_operation.py ---------------------------------
# Session fixtures, registered by conftest.py: the two files start one server between them (a server start
# is the expensive part of their tests), not one each.

API_KEY = "test-key"
PROMPT = "the word of the hot one"  # every word is in the tokenizer's vocabulary
MAX_N = 16
"""The shared server's ``--max-n``: 16 samples of `PROMPT` (6 tokens) and 74 new tokens fill its 160 pages of
8 tokens (``--num-pages 160``) and its 8 rows twice."""
MESSAGES = [
    {"role": "system", "content": "be a word"},
    {"role": "user", "content": "how are you"},
]


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_folder(tmp_path_factory.mktemp("server") / "tiny", seed=3)


@pytest.fixture(scope="session")
def server(folder: Path) -> Iterator[ServerProcess]:
    options = ("--api-key", API_KEY, "--max-n", str(MAX_N), "--num-pages", "160")
    started = start_server(folder, folder.parent / "server.log", *options)
    yield started
    assert started.stop() == 0, started.output()[-3000:]


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(scope="session")
def model(folder: Path) -> Any:
    return import_hf(folder)[1]


def post(server: ServerProcess, path: str, body: Any, key: str | None = API_KEY) -> httpx.Response:
    """POST ``body`` (JSON, or bytes as they are) to ``path`` with the API key ``key`` (None: none)."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers=headers, timeout=300)
