"""``halyard-serve --hf`` starts JAX's backend in a thread while it reads the folder (issue 53: on a TPU the
runtime's start takes seconds, which the reading and the imports now overlap), and an error of that start
ends the command as it did when the main thread started the backend.

In a fresh process the CPU backend's factory is replaced by one that records its start and then waits until
the folder's first tensor has been read: with the overlap the reading happens during the start; without it
the start gives up waiting after `WAIT_SECONDS` and the recorded order shows it. No timing is asserted.
The factory also records the TPU runtime's host buffer size the environment holds when the start begins
(`halyard.serve.server.host_transfer`: the command sizes it for the folder first).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from server_fixtures import server_environment, tiny_hf_folder

WAIT_SECONDS = 30
"""How long the replaced factory waits for the folder to be read (only a broken overlap waits that long)."""

SCRIPT = """
import dataclasses, json, os, sys, threading
from jax._src import xla_bridge
from halyard.export import sources

events, read_begun = [], threading.Event()
registration = xla_bridge._backend_factories["cpu"]

def factory():
    events.append("backend start begun")
    events.append("host buffer " + os.environ.get("TPU_PREMAPPED_BUFFER_SIZE", "unset"))
    if sys.argv[2] == "fail":
        raise RuntimeError("no device here")
    read_begun.wait(float(sys.argv[3]))
    events.append("backend start ended")
    return registration.factory()

xla_bridge._backend_factories["cpu"] = dataclasses.replace(registration, factory=factory)
read = sources.SafetensorsSource.read

def recorded_read(self, key, slices):
    if not read_begun.is_set():
        events.append("folder read")
        read_begun.set()
    return read(self, key, slices)

sources.SafetensorsSource.read = recorded_read
from halyard.serve.server.cli import main
try:
    code = main(["--hf", sys.argv[1], "--tensor", "2"])  # fails once the model is loaded: 1 device
finally:
    print(json.dumps(events))
sys.exit(code)
"""


def serve(folder: Path, mode: str) -> subprocess.CompletedProcess[str]:
    """``halyard-serve --hf folder --tensor 2`` with the recording factory (``mode``: wait or fail)."""
    command = [sys.executable, "-c", SCRIPT, str(folder), mode, str(WAIT_SECONDS)]
    environment = server_environment()
    environment.pop("TPU_PREMAPPED_BUFFER_SIZE", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_folder(tmp_path_factory.mktemp("backend-start") / "model", dtype="bfloat16")


def test_the_folder_is_read_while_the_backend_starts(hf_folder: Path) -> None:
    done = serve(hf_folder, "wait")
    events = json.loads(done.stdout.splitlines()[-1])
    # a tiny folder: the smallest buffer, set before the runtime starts
    buffer = f"host buffer {256 * 2**20}"
    assert events == ["backend start begun", buffer, "folder read", "backend start ended"], done.stderr[
        -3000:
    ]
    # the model reached the device: the engine's placement then refused --tensor 2 on one device, one line
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "error: --tensor 2: there are 1 devices; give 1 to 1"


def test_an_error_of_the_backends_start_ends_the_command_as_before(hf_folder: Path) -> None:
    done = serve(hf_folder, "fail")
    events = json.loads(done.stdout.splitlines()[-1])
    assert events.count("backend start begun") == 1, events  # tried once: not again by the main thread
    assert done.returncode == 1
    error = "RuntimeError: Unable to initialize backend 'cpu': no device here"  # JAX's message, as before
    assert any(line.startswith(error) for line in done.stderr.splitlines()), done.stderr[-3000:]
