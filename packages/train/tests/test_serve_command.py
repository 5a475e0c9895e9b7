"""``halyard serve --run R``: a run's latest checkpoint behind the OpenAI-compatible server, in a
subprocess on loopback, answering the official ``openai`` client with what ``halyard generate`` prints for
the same checkpoint; SIGTERM stops it with code 0; bad options are one line and exit code 2."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jax
import openai
import pytest
from trainer_fixtures import fails

from halyard.serve import Engine
from halyard.serve.int8_weights import Int8Linear
from halyard.train.cli import main
from halyard.train.commands import generate


def is_int8(node: object) -> bool:
    return isinstance(node, Int8Linear)


FIXTURE = Path(__file__).parent / "fixtures" / "run-0.3.0"  # the demo at a tiny size, step-4 checkpoint
ENGINE = ["--page-size", "8", "--num-pages", "16", "--max-context", "64", "--max-running", "4",
          "--chunk-size", "16", "--max-prefill-rows", "1", "--deterministic"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_halyard_serve_answers_with_the_runs_latest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "demo-run"
    shutil.copytree(FIXTURE, run)
    port = _free_port()
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
        JAX_PLATFORMS="cpu",
    )
    code = "import sys; from halyard.train.cli import main; sys.exit(main(sys.argv[1:]))"
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--run", str(run), "--port", str(port), *ENGINE],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["demo-run"]
        answer = client.completions.create(model="demo-run", prompt="def ", max_tokens=4, temperature=0)
        with pytest.raises(openai.BadRequestError) as raised:  # the demo's tokenizer has no chat template
            client.chat.completions.create(model="demo-run", messages=[{"role": "user", "content": "hi"}])
        assert raised.value.param == "messages" and "chat template" in raised.value.message
    finally:
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(60)
        log.close()
    assert returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert main(["generate", "--run", str(run), "--prompt", "def ", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out == "def " + answer.choices[0].text + "\n"


def test_bad_serve_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = fails(capsys, ["serve", "--run", str(tmp_path / "no-run")])
    assert code == 2 and "no-run" in err
    code, err = fails(capsys, ["serve", "--run", str(FIXTURE), "--num-pages", "0"])
    assert code == 2 and "--num-pages must be a positive int" in err
    code, err = fails(capsys, ["serve", "--hf", str(tmp_path), "--step", "3"])
    assert code == 2 and "--step needs --run" in err
    code, err = fails(capsys, ["serve", "--run", str(FIXTURE), "--dtype", "bfloat16"])
    assert (
        code == 2 and "--dtype bfloat16 needs --hf: a run's checkpoint is served in its trained dtype" in err
    )
    code, err = fails(
        capsys, ["serve", "--run", str(FIXTURE), "--quantization", "int8", "--training-arithmetic"]
    )
    assert code == 2 and "--quantization='int8' does not go with --training-arithmetic" in err


def test_generate_runs_an_int8_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``halyard generate --quantization int8``: its engine holds the int8 weights (the serve tests compare
    such an engine's answers with the int8 model's)."""
    run = tmp_path / "demo-run"
    shutil.copytree(FIXTURE, run)
    engines: list[Engine] = []

    def recorded(*args: Any, **kwargs: Any) -> Engine:
        engines.append(Engine(*args, **kwargs))
        return engines[-1]

    monkeypatch.setattr(generate, "Engine", recorded)
    argv = [
        "generate",
        "--run",
        str(run),
        "--prompt",
        "def ",
        "--max-new-tokens",
        "4",
        "--quantization",
        "int8",
    ]
    assert main(argv) == 0 and capsys.readouterr().out.startswith("def ")
    (engine,) = engines
    assert engine.config.quantization == "int8"
    assert any(isinstance(node, Int8Linear) for node in jax.tree.leaves(engine.runner.model, is_leaf=is_int8))
