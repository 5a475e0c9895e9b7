"""How soon ``halyard serve`` answers its first request: cold (an empty compilation cache) and warm (a second
start with the cache the first filled), through a unix socket (``--uds``: the TPU machine allows no TCP).

The model: Qwen2.5-0.5B's shape with random weights (``--size tpu``; written once as a Hugging Face folder in
bfloat16 with a small word-level tokenizer, the vocabulary kept whole) or a tiny Qwen2 (``--size small``, for
a CPU). Each start runs ``halyard serve --hf FOLDER --uds SOCKET --compilation-cache DIR`` (plus
``--warmup`` with ``--warmup``) and times, from the moment the process is started: ``/health`` answering
(the model loaded and the engine built), the first completion of ``--new-tokens`` tokens from a 100-token
prompt (its step programs compiled, or loaded from the cache), and a second completion of the same size
(nothing left to compile). This process stays off the accelerator (``JAX_PLATFORMS=cpu``): only one process
can hold a TPU chip, and the server needs it.

Usage::

    python benchmarks/serving/serve_first_request.py --size tpu --work /tmp/first     # on the TPU
    python benchmarks/serving/serve_first_request.py --size small                        # a CPU, seconds

Results: printed, and JSON (``--output``, default benchmarks/results/serve_first_request.json); each server's
log beside it (``--logs``, default the work folder).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ACCELERATOR_ENV = dict(os.environ)
"""The servers' environment: this process's as it started (it then keeps JAX on the CPU: only one process
can hold a TPU chip, and the servers need it)."""
RESULTS = Path(__file__).resolve().parents[1] / "results" / "serve_first_request.json"
ROOT = Path(__file__).resolve().parents[2]
WORDS = ["<unk>", "<|endoftext|>", *(f"w{i}" for i in range(62))]
PROMPT = [(7 * i + 3) % 60 + 2 for i in range(100)]
ENGINE_OPTIONS = {
    "tpu": ["--max-context", "1024", "--num-pages", "256", "--max-running", "16", "--chunk-size", "128"],
    "small": ["--max-context", "128", "--num-pages", "32", "--page-size", "16", "--max-running", "4", "--chunk-size", "32"],
}  # fmt: skip


class UnixConnection(http.client.HTTPConnection):
    """An HTTP connection over a unix socket (the standard library's client, no dependency)."""

    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def request(path: Path, method: str, route: str, body: Any = None, timeout: float = 600) -> tuple[int, Any]:
    """``method route`` on the server at unix socket ``path``: (status, parsed JSON body or text)."""
    connection = UnixConnection(path, timeout)
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(method, route, payload, {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
    finally:
        connection.close()
    try:
        return response.status, json.loads(text)
    except json.JSONDecodeError:
        return response.status, text


def write_model(folder: Path, size: str) -> Path:
    """A random model of ``size`` as a Hugging Face folder (bfloat16) with a word-level tokenizer."""
    from halyard.export.config_reading import config_from_hf_dict
    from halyard.models import model_config

    if (folder / "config.json").is_file():
        return folder
    if size == "tpu":
        hf = json.loads(
            (ROOT / "packages/export/tests/fixtures/hf-configs/qwen2/Qwen2.5-0.5B.json").read_text()
        )
        config, _ = config_from_hf_dict(hf, overrides={"param_dtype": "bfloat16"})
    else:
        config = model_config(
            "qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, max_position=256, tie_embeddings=True,
        )  # fmt: skip
    return write_random_model(folder, config)


def write_random_model(folder: Path, config: Any, dtype: str = "bfloat16") -> Path:
    """A random model of ``config`` as a Hugging Face folder (weights in ``dtype``) with a word-level
    tokenizer of `WORDS` (the vocabulary kept whole), its end-of-text id 1."""
    import jax
    from tokenizers import Tokenizer, models, pre_tokenizers

    from halyard.export import export_hf
    from halyard.models import init_model

    tokenizer_folder = folder.parent / f"{folder.name}-tokenizer"
    tokenizer_folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tokenizer_folder / "tokenizer.json"))
    settings = {
        "eos_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (tokenizer_folder / "tokenizer_config.json").write_text(json.dumps(settings))
    model = init_model(config, jax.random.key(0))
    vocab = model.unembedding.axis_size("vocab")
    export_hf(model, folder, tokenizer=tokenizer_folder, dtype=dtype, vocab_size=vocab, eos_token_id=1)
    return folder


def start_once(
    folder: Path, work: Path, name: str, extra: list[str], new_tokens: int, limit: float
) -> dict[str, Any]:
    """Start ``halyard serve`` on a unix socket, time /health and two completions from the start, stop it."""
    sock = Path(tempfile.mkdtemp(prefix="hs-")) / "s"  # a unix socket path must stay under 108 bytes
    log = work / f"server_{name}.log"
    command = [
        sys.executable, "-m", "halyard.train.cli", "serve", "--hf", str(folder), "--uds", str(sock),
        "--model-name", "m", "--log-level", "warning", *extra,
    ]  # fmt: skip
    result: dict[str, Any] = {"command": " ".join(command[1:])}
    started = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=_ACCELERATOR_ENV)
        try:
            while "health_seconds" not in result:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"the server exited with {process.returncode}: {log.read_text()[-2000:]}"
                    )
                if time.perf_counter() - started > limit:
                    raise TimeoutError(f"no /health within {limit} s")
                try:
                    if request(sock, "GET", "/health", timeout=5)[0] == 200:
                        result["health_seconds"] = time.perf_counter() - started
                except OSError:
                    time.sleep(0.1)
            body = {
                "model": "m",
                "prompt": PROMPT,
                "max_tokens": new_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            for key in ("first_request_seconds", "second_request_seconds"):
                status, answer = request(sock, "POST", "/v1/completions", body, timeout=limit)
                if status != 200:
                    raise RuntimeError(f"completion: HTTP {status}: {answer}")
                result[key] = time.perf_counter() - started
                result["completion_tokens"] = answer["usage"]["completion_tokens"]
            result["second_request_only_seconds"] = (
                result["second_request_seconds"] - result["first_request_seconds"]
            )
            status, stats = request(sock, "GET", "/stats", timeout=30)
            for name in ("programs_compiled", "programs_loaded"):
                result[name] = stats.get(name) if status == 200 else None
        except (RuntimeError, TimeoutError, OSError) as error:
            result["error"] = f"{type(error).__name__}: {error}"
        finally:
            process.send_signal(signal.SIGINT)
            try:
                result["exit_code"] = process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                result["exit_code"] = process.wait()
    shutil.rmtree(sock.parent, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(ENGINE_OPTIONS), default="tpu")
    parser.add_argument(
        "--work", type=Path, default=None, help="model, cache and logs (default: a temporary folder)"
    )
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens each completion asks for")
    parser.add_argument(
        "--warmup", action="store_true", help="start with --warmup (every step shape at start)"
    )
    parser.add_argument("--limit", type=float, default=240.0, help="seconds one start may take in all")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)  # fmt: skip
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX starts (write_model imports it)
    work = args.work or Path(tempfile.mkdtemp(prefix="first-request-"))
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    folder = write_model(work / f"model-{args.size}", args.size)
    results: dict[str, Any] = {"size": args.size, "model_write_seconds": time.perf_counter() - began}
    cache = work / "compilation-cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold: nothing compiled yet
    extra = [
        *ENGINE_OPTIONS[args.size],
        "--compilation-cache",
        str(cache),
        *(["--warmup"] if args.warmup else []),
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for name in ("cold", "warm"):
        results[name] = start_once(folder, work, name, extra, args.new_tokens, args.limit)
        print(name, json.dumps(results[name]), flush=True)
        args.output.write_text(json.dumps(results, indent=1))
    results["goal"] = {"cold_seconds": 60, "warm_seconds": 10}
    results["met"] = {
        name: results[name].get("first_request_seconds", float("inf")) <= goal
        for name, goal in (("cold", 60), ("warm", 10))
    }
    print("first request within 60 s cold / 10 s warm:", results["met"])
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
